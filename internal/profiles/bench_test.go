package profiles

import (
	"os/exec"
	"testing"
)

// BenchmarkProfiles compares a call through each profile's run tool with
// pysandbox's own run_python and with spawning python3, in the same run:
// a profile adds only its result formatting.
func BenchmarkProfiles(b *testing.B) {
	cases := []struct{ spec, tool, arg string }{
		{"pysandbox", "run_python", "code"},
		{"mcp-run-python", "run_python_code", "python_code"},
		{"mcp-python-exec-sandbox", "execute_python", "script"},
		{"mcp-run-python-code", "run_python_code", "code"},
	}
	for _, c := range cases {
		b.Run(c.spec, func(b *testing.B) {
			cs := connectB(b, c.spec)
			for b.Loop() {
				res, err := cs.CallTool(b.Context(), callParams(c.tool, c.arg, "print(1 + 1)"))
				if err != nil || res.IsError {
					b.Fatalf("%v %+v", err, res)
				}
			}
		})
	}
	b.Run("python3 -c", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("python3", "-c", "print(1 + 1)").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
