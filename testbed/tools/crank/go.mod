module github.com/cascade-guard/cascade-guard/testbed/tools/crank

// Builds crank (cmd/crank, the `crossplane` CLI that builds and pushes
// packages) of one pinned release from the Go module proxy. crank left the
// repository in v2.3, so this pins v2.2.1, apart from core's wrapper. See
// ../crank.sh.

go 1.25.9

require github.com/crossplane/crossplane/v2 v2.2.1 // indirect
