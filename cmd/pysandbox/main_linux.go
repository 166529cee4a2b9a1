//go:build linux

// Command pysandbox is an MCP server that runs Python from AI agents in a
// fresh, layered Linux sandbox. See the README. On other systems
// (main_other.go) it runs the Linux server in a container.
package main

import (
	"os"

	"github.com/pysandbox/pysandbox/internal/cli"
	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func main() {
	// When this binary is re-executed as a sandbox's init, InitMain takes
	// over and never returns. It must run before anything else.
	sandbox.InitMain()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
