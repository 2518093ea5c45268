// Command coredns is CoreDNS trimmed to the plugins the cluster harness's real-pods level serves pod DNS
// with (no cloud SDKs): the upstream main with a shorter plugin list.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The upstream order (core/dnsserver/zdirectives.go) of the plugins compiled in.
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
