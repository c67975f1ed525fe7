// Package deploy holds no code: it is the home of the tests that check what the repository ships for running the
// gateway in production against the gateway itself. The Grafana dashboard (grafana/switchyard.json) may only
// query metrics and labels a real gateway exports; the Helm chart (helm/switchyard) must render into valid
// Kubernetes objects whose probes, ports and policy agree with the gateway's. The tests live here, in a package
// of their own, so that only this test binary links Helm and the Kubernetes API types.
package deploy
