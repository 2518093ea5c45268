//go:build tools

// Package tools pins the Kueue controller the cluster test harness runs: the same release
// (0.16.2) as base/components/kueue installs, and the chart inside its module zip (charts/kueue).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
