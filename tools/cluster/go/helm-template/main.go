// Command helm-template renders a Helm chart from a folder with given values, the way `helm template`
// (and Flux's helm-controller, which links the same Helm packages) renders it before installing:
//
//	helm-template CHART_DIR RELEASE NAMESPACE VALUES.yaml [TEMPLATE_PREFIX...]
//
// It prints every rendered manifest (or those whose template path starts with one of the prefixes,
// e.g. templates/webhook/) as one YAML stream, in template path order. Pinned to Helm v3.20.0, whose
// Kubernetes libraries (v0.35.0) are the ones Kueue v0.16.2 builds with, so the two builds share their
// compiled dependencies.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: helm-template CHART_DIR RELEASE NAMESPACE VALUES.yaml [TEMPLATE_PREFIX...]")
		os.Exit(2)
	}
	chartDir, release, namespace, valuesFile, prefixes := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5:]
	if err := render(chartDir, release, namespace, valuesFile, prefixes); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
}

func render(chartDir, release, namespace, valuesFile string, prefixes []string) error {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return err
	}
	vals, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		return err
	}
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(chrt, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return err
	}
	out, err := engine.Render(chrt, top)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		rel := strings.TrimPrefix(name, chrt.Name()+"/")
		if strings.HasSuffix(rel, "NOTES.txt") || strings.TrimSpace(out[name]) == "" || !wanted(rel, prefixes) {
			continue
		}
		fmt.Printf("---\n# Source: %s\n%s\n", rel, out[name])
	}
	return nil
}

func wanted(path string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}
