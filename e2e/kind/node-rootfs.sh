#!/usr/bin/env bash
# Turns a Debian root filesystem into kind's node base (run by e2e/kind/build.sh as mmdebstrap's customize hook):
# the steps of kind's images/base/Dockerfile on its files, with Debian's containerd, runc and CNI plugins where
# kind builds its own from git, and containerd told what this host cannot grant.
#
#   bash e2e/kind/node-rootfs.sh ROOTFS KIND_BASE_FILES
set -euo pipefail
R="$1"
FILES="$2"

# kind's files (entrypoint, units, containerd and crictl configs, /kind/bin), writable and with the Dockerfile's modes.
# (The module cache's copies are read-only: the directories that exist keep their modes, the files get root's.)
tar -C "$FILES" --exclude=./LICENSES --owner=0 --group=0 -cf - . | tar -C "$R" -xf - --no-overwrite-dir
(cd "$FILES" && find . -path ./LICENSES -prune -o -type f -print) | while read -r f; do chmod u+w "$R/$f"; done
chmod 0755 "$R/kind" "$R/kind/bin" "$R/kind/bin/"* "$R/usr/local/bin/entrypoint" "$R/usr/local/bin/clean-install"

# The Dockerfile's clean-up: no unit starts that a container cannot run; systemd as init.
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
ln -sf /lib/systemd/systemd "$R/sbin/init"
chroot "$R" systemctl enable kubelet.service containerd.service undo-mount-hacks.service
chroot "$R" systemctl mask systemd-binfmt.service
mkdir -p "$R/etc/kubernetes/manifests"

# Debian's binaries where kind's units and defaults look for its own.
ln -sf /usr/bin/containerd "$R/usr/local/bin/containerd"
mkdir -p "$R/opt/cni"
ln -sfn /usr/lib/cni "$R/opt/cni/bin"

# containerd: no fuse-overlayfs (rootless only); the sandbox image the node image carries; pods' OOM scores no
# lower than containerd's own (0): this host cannot lower a score (no CAP_SYS_RESOURCE), and the kubelet's -997
# and containerd's -998 for sandboxes would make runc fail.
cfg="$R/etc/containerd/config.toml"
sed -i -e '/^\[proxy_plugins\]/,/^$/d' \
  -e 's|^\(\s*sandbox_image\s*=\s*\).*|\1"docker.io/weightstream/pause:3.10"|' \
  -e 's|^\(\s*restrict_oom_score_adj\s*=\s*\).*|\1true|' "$cfg"
grep -q 'restrict_oom_score_adj = true' "$cfg" && grep -q 'weightstream/pause:3.10' "$cfg" \
  || { echo "node-rootfs.sh: kind's containerd config has changed shape: $cfg" >&2; exit 1; }
! grep -q fuse-overlayfs "$cfg" || { echo "node-rootfs.sh: fuse-overlayfs is still in $cfg" >&2; exit 1; }
# The runtime spec every pod starts from (the Dockerfile's, from containerd's own default).
chroot "$R" ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' >"$R/etc/containerd/cri-base.json"

rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/* "$R"/usr/share/doc "$R"/usr/share/man "$R"/usr/share/locale
