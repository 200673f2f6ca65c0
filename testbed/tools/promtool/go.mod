// Pins promtool (github.com/prometheus/prometheus/cmd/promtool) for
// scripts/promtool.sh, which builds it with the Go module proxy. Prometheus's
// Go module versions are v0.3xx.y for Prometheus 3.xx.y: v0.307.3 is 3.7.3.
module cascade-guard.dev/prometheus-pin

go 1.24.0

require github.com/prometheus/prometheus v0.307.3
