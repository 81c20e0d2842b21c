package probe

import "testing"

func BenchmarkSampleProcs(b *testing.B) {
	p, _ := New(Config{})
	for b.Loop() {
		if _, err := p.sampleProcs(); err != nil {
			b.Fatal(err)
		}
	}
}
