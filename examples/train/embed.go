// Package train ships the training-style example job, so that the
// recovery drill runs the very script users read in examples/train.
package train

import _ "embed"

// Script is train.sh.
//
//go:embed train.sh
var Script []byte
