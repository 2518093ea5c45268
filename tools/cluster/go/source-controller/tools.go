//go:build tools

// Package tools pins Flux source-controller for the cluster test harness.
package tools

import _ "github.com/fluxcd/source-controller"
