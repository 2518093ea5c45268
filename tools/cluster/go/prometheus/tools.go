//go:build tools

// Package tools pins Prometheus 3 and promtool for the alert-rule and scrape tests.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
