package launcher

import (
	"os"
	"runtime"
	"syscall"
)

var hostOS = runtime.GOOS

// forwarded are the signals passed on to the runtime (on Windows only an
// interrupt can be sent to a process; the others are never delivered).
var forwarded = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}
