//go:build tools

// Package tools pins the Kubeflow Trainer v2 controller manager and the JobSet controller the cluster
// test harness runs for clusters with job_api: trainjob: the same releases (Trainer 2.3.0, JobSet
// 0.12.0, the one Trainer's go.mod requires) as the HelmRelease generators/render/trainjob.py writes.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
