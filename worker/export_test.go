package worker

// ScratchHeld is how many of class's shards in flight count as holding
// what they need of the scratch (scratchadmit.go): for tests, which check
// that every count ends with its shard.
func (w *Worker) ScratchHeld(class string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.scratchHeld[class]
}
