// Sources of CRDs and schemas that no harness binary is built from: the CRD YAML of the
// Prometheus operator, Kueue and Karpenter, and eksctl's ClusterConfig JSON schema. Nothing here is
// compiled; tools/cluster/schemas.py downloads each module zip with `go mod download` and checks it
// against go.sum. The Training Operator and Flux CRDs come from the modules the harness builds
// (tools/cluster/<component>/go.mod); image.toolkit.fluxcd.io is vendored (vendor/SOURCES.md).
module fsdp-gitops/tools/cluster/crds

go 1.26.0

require (
	// the monitoring.coreos.com CRDs kube-prometheus-stack installs (PodMonitor, ServiceMonitor, ...)
	github.com/prometheus-operator/prometheus-operator v0.85.0
	// Kueue 0.16.2, the release base/components/kueue installs (kueue.x-k8s.io/v1beta2)
	sigs.k8s.io/kueue v0.16.2
	// Karpenter 1.14.0 (KARPENTER_VERSION of generators/cluster.py): karpenter.sh and karpenter.k8s.aws
	github.com/aws/karpenter-provider-aws v1.14.0
	// eksctl v0.230.0: pkg/apis/eksctl.io/v1alpha5/assets/schema.json checks overlays/provisioning/
	github.com/weaveworks/eksctl v0.230.0
)
