//go:build tools

// Package tools pins runc (built with cgo and the seccomp tag) for the cluster harness's real-pods level.
package tools

import (
	_ "github.com/opencontainers/runc"
)
