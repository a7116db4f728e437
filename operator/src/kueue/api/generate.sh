#!/usr/bin/env bash
# Regenerates Kueue's Rust types in this folder from the CRD schemas of the Kueue the e2e suite builds (the pin
# in e2e/kueue/build.sh), with kopium. Run it after changing that pin, then review the diff:
#   bash operator/src/kueue/api/generate.sh
# Needs go (to fetch sigs.k8s.io/kueue's module) and kopium $KOPIUM_VERSION (`cargo install kopium --version
# $KOPIUM_VERSION --locked`). Pod templates and tolerations, which Kueue's schemas embed from core/v1, are typed
# as k8s-openapi's PodTemplateSpec and Toleration (as kopium already does for Condition), so the operator builds
# pod sets from the pods it runs without a copy of the pod schema. `api::tests` fails when the pin moves and
# these files do not.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
KOPIUM_VERSION=0.24.1
kueue_version="$(sed -n 's/^KUEUE_VERSION="${WS_KUEUE_VERSION:-\(.*\)}"$/\1/p' "$root/e2e/kueue/build.sh")"
[[ -n "$kueue_version" ]] || { echo "generate.sh: no Kueue pin found in e2e/kueue/build.sh" >&2; exit 1; }
have="$(kopium --version 2>/dev/null || true)"
[[ "$have" == "kopium $KOPIUM_VERSION" ]] || {
  echo "generate.sh: needs kopium $KOPIUM_VERSION (found '${have:-none}'): cargo install kopium --version $KOPIUM_VERSION --locked" >&2
  exit 1
}
module="$(cd "$(mktemp -d)" && go mod download -json "sigs.k8s.io/kueue@v$kueue_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
bases="$module/config/components/crd/bases"
[[ -d "$bases" ]] || { echo "generate.sh: no CRDs in $bases" >&2; exit 1; }

# plural:Kind:what the file holds
for entry in "workloads:Workload:a unit of admission, the pods a job will run, waiting for quota" \
             "localqueues:LocalQueue:a namespace's queue, which feeds a ClusterQueue" \
             "resourceflavors:ResourceFlavor:a kind of nodes quota is counted for"; do
  IFS=: read -r plural kind what <<<"$entry"
  out="$here/$plural.rs"
  kopium --filename "$bases/kueue.x-k8s.io_$plural.yaml" --api-version v1beta2 --docs \
      --derive Default --derive PartialEq --smart-derive-elision \
    | python3 "$here/core_types.py" "$kind" "$what" "$kueue_version" "$KOPIUM_VERSION" > "$out.tmp"
  mv "$out.tmp" "$out"
done
rustfmt --edition 2024 --config-path "$root/rustfmt.toml" "$here"/{workloads,localqueues,resourceflavors}.rs
echo "generated from sigs.k8s.io/kueue@v$kueue_version with kopium $KOPIUM_VERSION: $(cd "$root" && git status --short "$here")"
