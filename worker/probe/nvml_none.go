//go:build !nvml

package probe

import "context"

// DefaultGPUs is the GPU source of this build: without the nvml tag it
// cannot inspect devices, and the probe reports GPUs as unknown where
// device nodes exist.
func DefaultGPUs() GPUSource { return noNVML{} }

type noNVML struct{}

func (noNVML) Devices(context.Context) ([]GPU, error) { return nil, ErrNVMLNotBuilt }
