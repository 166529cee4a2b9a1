package sandbox

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox init.
	InitMain()
	os.Exit(m.Run())
}
