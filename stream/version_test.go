package stream

import "testing"

// archive.txt of a checkout is the placeholder, which names no build;
// git archive writes a commit and its time, which fromArchive turns into
// the go command's pseudo-version of that commit.
func TestFromArchive(t *testing.T) {
	if _, _, ok := fromArchive(archived); ok {
		t.Errorf("archive.txt of this checkout (%q) read as a commit: git archive has not run here", archived)
	}
	for _, s := range []string{"", "$Format:%H %ct$", "8c129b9 1764860000", "zz129b9e0f1b2c3d4e5f60718293a4b5c6d7e8f9 1764860000", "8c129b9e0f1b2c3d4e5f60718293a4b5c6d7e8f9 soon"} {
		if rev, v, ok := fromArchive(s); ok {
			t.Errorf("fromArchive(%q) = %q, %q; want nothing", s, rev, v)
		}
	}
	rev, v, ok := fromArchive("8c129b9e0f1b2c3d4e5f60718293a4b5c6d7e8f9 1764860713\n")
	if !ok || rev != "8c129b9e0f1b2c3d4e5f60718293a4b5c6d7e8f9" || v != "v0.0.0-20251204150513-8c129b9e0f1b" {
		t.Errorf("fromArchive = %q, %q, %v; want the commit and v0.0.0-20251204150513-8c129b9e0f1b", rev, v, ok)
	}
}
