{{/* The chart's name, shortened to what a label value allows. */}}
{{- define "weightstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object: the release name, with the chart's name added unless it is already in it. */}}
{{- define "weightstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's objects: Deployment, ServiceAccount, roles, Service. */}}
{{- define "weightstream.operator.fullname" -}}
{{- printf "%s-operator" (include "weightstream.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weightstream.devicePlugin.fullname" -}}
{{- printf "%s-device-plugin" (include "weightstream.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "weightstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "weightstream.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels of every object but the selector ones, which the workloads add (instance is among those). */}}
{{- define "weightstream.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: weightstream
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of an object that has no selector labels of its own. */}}
{{- define "weightstream.labels" -}}
{{ include "weightstream.baseLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "weightstream.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightstream.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "weightstream.devicePlugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weightstream.name" . }}-device-plugin
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: device-plugin
{{- end }}

{{- define "weightstream.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "weightstream.runtime.image" -}}
{{- printf "%s:%s" .Values.runtime.image.repository (default .Chart.AppVersion .Values.runtime.image.tag) }}
{{- end }}

{{- define "weightstream.devicePlugin.image" -}}
{{- $repo := default .Values.operator.image.repository .Values.devicePlugin.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.operator.image.tag) .Values.devicePlugin.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* The namespaced permissions the operator uses on a job's children and on the jobs themselves. Each verb is
     one the operator calls: server-side apply is a patch (create when the object is new), the controller lists
     and watches jobs, pods and StatefulSets, cleanup lists and deletes by label. */}}
{{- define "weightstream.operator.namespacedRules" -}}
- apiGroups: [weightstream.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [weightstream.dev]
  resources: [trainingjobs/status]
  verbs: [patch]
- apiGroups: [weightstream.dev]
  # Setting blockOwnerDeletion on a child's owner reference needs update on the owner's finalizers.
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, create, patch, delete]
- apiGroups: [""]
  # The job's settings, and its post-mortem (read back to add a replaced pod's log to it).
  resources: [configmaps]
  verbs: [get, list, create, patch, delete]
- apiGroups: [""]
  # The end of each pod's log, kept in the job's post-mortem when it fails, a failed pod is replaced, or it is
  # deleted (crds::contract::postmortem).
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  # Each job's TLS identity: issued once, read back for the operator's calls to MemoryX, removed with the job.
  resources: [secrets]
  verbs: [get, list, create, delete]
- apiGroups: [""]
  # MemoryX's checkpoint claims come from its StatefulSet; the operator removes them with the job only under
  # spec.checkpoint.retain: Delete (they outlive it by default), and reads a job's data claim
  # (spec.data.volume) to say when it is missing.
  resources: [persistentvolumeclaims]
  verbs: [get, list, delete]
- apiGroups: [networking.k8s.io]
  # One NetworkPolicy per job (its pods accept traffic only from the job, the operator and metrics scrapers).
  resources: [networkpolicies]
  verbs: [list, create, patch, delete]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [""]
  # Why MemoryX's pod is missing: the StatefulSet controller says so only in a FailedCreate event.
  resources: [events]
  verbs: [list]
- apiGroups: [kueue.x-k8s.io]
  # A job labelled kueue.x-k8s.io/queue-name waits as a Workload the operator creates, starts when Kueue admits
  # it, and gives back (PodsReady, Finished, an evicted reservation cleared, Kueue's finalizer removed).
  resources: [workloads]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
- apiGroups: [kueue.x-k8s.io]
  # The ClusterQueue a job's LocalQueue feeds, for its status.
  resources: [localqueues]
  verbs: [get]
- apiGroups: [visibility.kueue.x-k8s.io]
  # A waiting job's position in its ClusterQueue.
  resources: [localqueues/pendingworkloads]
  verbs: [get]
{{- end }}

{{/* The operator pods' selector labels as key=value,key=value: the operator puts them in every job's
     NetworkPolicy, so the policy admits exactly the pods this chart labels. */}}
{{- define "weightstream.operator.selectorLabelList" -}}
{{- $pairs := list }}
{{- range $k, $v := (include "weightstream.operator.selectorLabels" . | fromYaml) }}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
