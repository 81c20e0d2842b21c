package checkpoint

// SetAfterSwap makes Publish call f between its swap and the handling of
// what the destination held, and returns a function that undoes it.
func SetAfterSwap(f func()) (undo func()) {
	afterSwap = f
	return func() { afterSwap = nil }
}
