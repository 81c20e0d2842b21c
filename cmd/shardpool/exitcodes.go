package main

import "errors"

// Exit codes, documented in docs/cli.md and the usage text.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitBlocked     = 3
	exitUnverified  = 4
	exitInterrupted = 130
)

// errUsage means the command line was wrong; the usage was already printed.
var errUsage = errors.New("usage")

// exitErr carries a specific exit code and a message to print.
type exitErr struct {
	code int
	msg  string
}

func (e exitErr) Error() string { return e.msg }
