package worker

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// ScriptProblem says why the kernel would not run the file at path, one
// that exists and may be executed, as a command, or "": a text file with
// no #! line (exec fails with "exec format error": a shell runs such a
// file with /bin/sh, exec does not), a #! line that ends in a carriage
// return (a script saved with Windows line ends: the kernel looks for an
// interpreter named "/bin/sh\r"), or a #! interpreter this host lacks
// (exec then says "no such file or directory" of the script itself, which
// is there). A `#!/usr/bin/env NAME` line's NAME is looked up with
// lookPath, when it is given (nil where the command's PATH is not this
// process's). Files that cannot be read, ELF binaries and other binary
// formats (which binfmt_misc may run) are left to exec. anyHost says the
// fault is the file's own (its #! line), the same on every host that sees
// it; an interpreter missing here may be on another host.
func ScriptProblem(path string, lookPath func(string) (string, error)) (why string, anyHost bool) {
	fields, why := scriptLine(path)
	if why != "" || len(fields) == 0 {
		return why, why != ""
	}
	interp := fields[0]
	if !filepath.IsAbs(interp) {
		return "", false
	}
	if fi, err := os.Stat(interp); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		why := "is not on this host"
		if err == nil {
			why = "is not an executable file"
		}
		return fmt.Sprintf("%s names the interpreter %s on its #! line, which %s (exec would say \"no such file or directory\" of the script itself)", path, interp, why), false
	}
	// #!/usr/bin/env python3: python3 is looked up on the command's PATH.
	// "env -S ..." and other options are left alone.
	if filepath.Base(interp) == "env" && len(fields) > 1 && !strings.HasPrefix(fields[1], "-") && !strings.Contains(fields[1], "=") && lookPath != nil {
		if _, err := lookPath(fields[1]); err != nil {
			return fmt.Sprintf("%s runs with #!%s, and %s is not on this host's PATH (exec would say \"no such file or directory\" of the script itself)", path, strings.Join(fields, " "), fields[1]), false
		}
	}
	return "", false
}

// scriptLine reads the #! line of the file at path: its fields, or why
// the kernel would not run the file whatever the host. Both are empty
// for a file that cannot be read, a binary, or an empty file.
func scriptLine(path string) (fields []string, why string) {
	f, err := os.Open(path)
	if err != nil {
		return nil, ""
	}
	defer f.Close()
	// The kernel reads the #! line from the first 256 bytes
	// (BINPRM_BUF_SIZE).
	buf := make([]byte, 256)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF {
		return nil, ""
	}
	head := buf[:n]
	if !bytes.HasPrefix(head, []byte("#!")) {
		if n == 0 || !looksLikeText(head) {
			return nil, ""
		}
		return nil, fmt.Sprintf("%s is a text file with no #! line, so the kernel cannot run it (exec format error; a shell would have run it with /bin/sh): "+
			"make its first line #!/bin/sh (or the interpreter it is written for), or name the interpreter first in the command ([\"sh\", %q, ...])", path, path)
	}
	line, _, _ := bytes.Cut(head[2:], []byte("\n"))
	if bytes.HasSuffix(line, []byte("\r")) {
		return nil, fmt.Sprintf("%s has Windows line ends: its #! line ends in a carriage return, so the kernel looks for an interpreter named %q, which no host has; "+
			"convert the file (dos2unix %s, or sed -i 's/\\r$//' %s)", path, strings.TrimSpace(strings.TrimRight(string(line), "\r"))+"\r", path, path)
	}
	fields = strings.Fields(string(line))
	if len(fields) == 0 {
		return nil, fmt.Sprintf("%s has an empty #! line, so the kernel cannot run it: name its interpreter there (#!/bin/sh, #!/usr/bin/env python3)", path)
	}
	return fields, ""
}

// looksLikeText reports whether b, the start of a file, is UTF-8 text
// without control characters other than whitespace.
func looksLikeText(b []byte) bool {
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			// A rune cut at the end of the buffer is still text.
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' && r != '\f' {
			return false
		}
		b = b[size:]
	}
	return true
}

// startProblem says why a command that failed to start did, where the
// program is a script the kernel would not run (ScriptProblem), or "".
// argv0 is found as exec finds it: a path with a slash relative to dir,
// else on PATH of env.
func startProblem(argv0, dir string, env []string) string {
	path := argv0
	if !strings.Contains(argv0, "/") {
		p, err := exec.LookPath(argv0)
		if err != nil {
			return ""
		}
		path = p
	} else if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	var look func(string) (string, error)
	if envPATH(env) == os.Getenv("PATH") {
		look = exec.LookPath
	}
	why, _ := ScriptProblem(path, look)
	return why
}

// envPATH is PATH's value in env, a KEY=value list (the last one counts).
func envPATH(env []string) string {
	v := ""
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			v = p
		}
	}
	return v
}
