//go:build tools

// Package tools pins Flux kustomize-controller for the cluster test harness.
package tools

import _ "github.com/fluxcd/kustomize-controller"
