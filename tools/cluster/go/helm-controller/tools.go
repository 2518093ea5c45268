//go:build tools

// Package tools pins Flux helm-controller for the cluster test harness.
package tools

import _ "github.com/fluxcd/helm-controller"
