//go:build tools

// Package tools pins Karpenter's core with its kwok cloud provider: the node autoscaler of the
// harness's Karpenter add-on, whose nodes kwok plays (the same core release as the AWS provider
// that eksctl installs with --karpenter).
package tools

import _ "sigs.k8s.io/karpenter/kwok"
