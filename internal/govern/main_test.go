package govern

import (
	"os"
	"testing"

	"github.com/pysandbox/pysandbox/internal/sandbox"
)

func TestMain(m *testing.M) {
	// The native backend re-executes this test binary as the sandbox
	// init (TestFactsCacheWithRealSandboxes).
	sandbox.InitMain()
	os.Exit(m.Run())
}
