module github.com/pysandbox/pysandbox/deploy/kubernetes/seccomp/gen

go 1.26.8

require (
	github.com/moby/profiles/seccomp v0.3.0
	github.com/opencontainers/runtime-spec v1.2.1
)

require golang.org/x/sys v0.33.0 // indirect
