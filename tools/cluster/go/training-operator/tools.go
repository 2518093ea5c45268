//go:build tools

// Package tools pins the Kubeflow Training Operator the cluster test harness runs.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
