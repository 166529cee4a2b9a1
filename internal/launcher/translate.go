package launcher

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// How a serve flag's file reaches the container.
const (
	fileRO      = iota + 1 // the file, read-only
	fileDirRW              // the file's directory, read-write (the file may not exist yet; rotation writes beside it)
	dirRW                  // the directory, read-write
	dirOrURL               // a directory, read-only, unless the value is a URL
	fileOrURL              // a file, read-only, unless the value is a URL
	hostPy                 // an interpreter: a version passes, a host path is refused
	dirRWOrNone            // a directory, read-write, unless the value is "none"
)

// FileFlags are serve's flags whose values are host paths, and how each
// is mounted. TestLauncherFlags (internal/cli) checks that every serve
// flag that names a file is here.
var FileFlags = map[string]int{
	"policy": fileRO, "upstream": fileRO,
	"auth-token-file": fileRO, "operator-token-file": fileRO, "metrics-token-file": fileRO,
	"tls-cert": fileRO, "tls-key": fileRO,
	"approval-key-file": fileRO, "replica-token-file": fileRO,
	"audit-log":  fileDirRW,
	"cache-dir":  dirRW,
	"state-dir":  dirRWOrNone,
	"find-links": dirOrURL, "python-downloads-json-url": fileOrURL,
	"python": hostPy, "python-version": hostPy,
}

// BoolFlags are serve's boolean flags (they take no separate value).
// TestLauncherFlags checks the list against serve's flag set.
var BoolFlags = map[string]bool{
	"allow-sdist": true, "audit-sync-each": true, "console": true, "insecure-no-auth": true, "no-index": true,
	"h": true, "help": true,
}

// Refused are serve's flags the launcher cannot pass, and why.
var Refused = map[string]string{
	"http":          "the launcher serves MCP over stdio; to serve HTTP from the container, run the image yourself with the port published (docs/commands.md, \"In a container\")",
	"internal-http": "the launcher serves MCP over stdio; several replicas run the image on Kubernetes (docs/kubernetes.md)",
}

// Mount is one bind mount of a host path into the container.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// String is the mount as --mount takes it (Podman and Docker alike).
func (m Mount) String() string {
	s := "type=bind,source=" + m.Source + ",target=" + m.Target
	if m.ReadOnly {
		s += ",readonly"
	}
	return s
}

// Translate rewrites serve's flags for the container on a host running
// goos: every file a flag names is bind-mounted (read-only, or its
// directory read-write for the audit log and the cache) at the same path
// inside, or under /host when that path cannot be used there (a Windows
// path, or one of the image's system directories), and the flag's value
// becomes the path inside. cacheVolume is whether the dependency cache
// should be the named CacheVolume (no --cache-dir given).
func Translate(args []string, goos string) (out []string, mounts []Mount, cacheVolume bool, err error) {
	cacheVolume = true
	add := func(m Mount) {
		for i, o := range mounts {
			if o.Target == m.Target {
				mounts[i].ReadOnly = o.ReadOnly && m.ReadOnly
				return
			}
		}
		mounts = append(mounts, m)
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return nil, nil, false, fmt.Errorf("serve takes no arguments, got %q", args[i:])
		}
		dashes := "-"
		if strings.HasPrefix(a, "--") {
			dashes = "--"
		}
		name, value, inline := strings.Cut(a[len(dashes):], "=")
		if why, ok := Refused[name]; ok {
			return nil, nil, false, fmt.Errorf("%s%s: %s", dashes, name, why)
		}
		if BoolFlags[name] {
			out = append(out, a)
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return nil, nil, false, fmt.Errorf("flag needs an argument: %s", a)
			}
			i++
			value = args[i]
		}
		kind := FileFlags[name]
		if kind == dirRW {
			cacheVolume = false
		}
		if kind != 0 && value != "" {
			if value, err = mountValue(dashes+name, kind, value, goos, add); err != nil {
				return nil, nil, false, err
			}
		}
		if inline {
			out = append(out, dashes+name+"="+value)
		} else {
			out = append(out, dashes+name, value)
		}
	}
	return out, mounts, cacheVolume, nil
}

// mountValue mounts the host path value of flag and returns the path
// the server inside gets.
func mountValue(flag string, kind int, value, goos string, add func(Mount)) (string, error) {
	switch kind {
	case hostPy:
		if strings.ContainsAny(value, `/\`) {
			return "", fmt.Errorf("%s %s: the server runs in the container, with the image's Python; a host interpreter cannot be used there (give a version, such as 3.11, or leave it out)", flag, value)
		}
		return value, nil
	case dirOrURL, fileOrURL:
		if strings.Contains(value, "://") {
			return value, nil
		}
	case dirRWOrNone:
		if value == "none" {
			return value, nil
		}
	}
	abs, err := filepath.Abs(value)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flag, value, err)
	}
	if strings.ContainsAny(abs, ",\n") {
		return "", fmt.Errorf("%s %s: a path with a comma or a newline cannot be mounted into the container; move the file", flag, abs)
	}
	st, statErr := os.Stat(abs)
	switch kind {
	case fileRO, fileOrURL:
		if statErr != nil {
			return "", fmt.Errorf("%s: %w", flag, statErr)
		}
		if !st.Mode().IsRegular() {
			return "", fmt.Errorf("%s %s: not a regular file", flag, abs)
		}
		target, err := containerPath(abs, goos, false)
		if err != nil {
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		add(Mount{Source: abs, Target: target, ReadOnly: true})
		return target, nil
	case fileDirRW:
		if statErr == nil && st.IsDir() {
			return "", fmt.Errorf("%s %s: a directory, not a file", flag, abs)
		}
		dir := filepath.Dir(abs)
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return "", fmt.Errorf("%s %s: its directory %s does not exist", flag, abs, dir)
		}
		target, err := containerPath(dir, goos, true)
		if err != nil {
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		add(Mount{Source: dir, Target: target})
		return path.Join(target, filepath.Base(abs)), nil
	default: // dirRW, dirOrURL, dirRWOrNone
		if statErr != nil {
			return "", fmt.Errorf("%s: %w", flag, statErr)
		}
		if !st.IsDir() {
			return "", fmt.Errorf("%s %s: not a directory", flag, abs)
		}
		target, err := containerPath(abs, goos, true)
		if err != nil {
			return "", fmt.Errorf("%s: %w", flag, err)
		}
		add(Mount{Source: abs, Target: target, ReadOnly: kind == dirOrURL})
		return target, nil
	}
}

// systemDirs are the image's directories a host path must not be mounted
// over (nor into): the server's binary, Python, its state.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys", "/dev", "/run", "/var/lib/pysandbox", "/var/cache/pysandbox", "/host"}

// coveringDirs are directories that, mounted whole, would hide what the
// server needs below them.
var coveringDirs = []string{"/", "/var", "/var/lib", "/var/cache", "/tmp", "/var/tmp", "/root"}

// containerPath is where the host path abs (absolute, cleaned) appears in
// the container: the same path on a Unix host, unless it is in one of the
// image's system directories (or a directory mount would cover them);
// then, and for Windows paths, /host/PATH (C:\x\y is /host/c/x/y).
func containerPath(abs string, goos string, dir bool) (string, error) {
	if goos == "windows" {
		vol := filepath.VolumeName(abs)
		if len(vol) != 2 || vol[1] != ':' {
			return "", fmt.Errorf("%s: only paths on a drive letter (C:\\...) can be mounted into the container", abs)
		}
		rest := filepath.ToSlash(strings.TrimPrefix(abs, vol))
		return path.Join("/host", strings.ToLower(vol[:1]), rest), nil
	}
	if !strings.HasPrefix(abs, "/") {
		return "", errors.New(abs + ": not an absolute path")
	}
	p := path.Clean(abs)
	for _, s := range systemDirs {
		if p == s || strings.HasPrefix(p, s+"/") {
			return path.Join("/host", p), nil
		}
	}
	if dir {
		for _, c := range coveringDirs {
			if p == c {
				return path.Join("/host", p), nil
			}
		}
	}
	return p, nil
}
