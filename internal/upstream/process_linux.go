package upstream

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes a stdio server the leader of a process group of its
// own, so that Close can end what it started too (npx runs node under a
// shell), and has the kernel kill it if this process dies without
// closing it (PR_SET_PDEATHSIG: it fires when the thread that started
// the child exits, which for Go's runtime threads is in practice the
// process).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills what is left of a stdio server's process group once
// its session is closed (the SDK has waited for the leader).
func killGroup(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	// The group's id is the leader's pid (Setpgid with Pgid 0).
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
