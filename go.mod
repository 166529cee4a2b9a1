module github.com/pysandbox/pysandbox

go 1.26.8

require (
	github.com/containerd/cgroups/v3 v3.1.3 // indirect
	github.com/moby/sys/userns v0.1.0 // indirect
	github.com/modelcontextprotocol/go-sdk v1.8.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
