package coordinator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/shardpool/shardpool/checkpoint"
)

// TokenName is the file in a coordinator's store directory that holds the
// token its clients must present when Config.Auth is set. Without one,
// any user of the host (or of the network, for a coordinator listening
// beyond loopback) could connect, rewrite a run's command in the runs
// bucket and have this user's workers execute it.
const TokenName = "token"

// loadOrCreateToken reads the token at path, or writes a new random one
// there, readable by this user alone. The token stays the same across
// restarts on the same store: workers that hold it reconnect.
func loadOrCreateToken(path string) (string, error) {
	tok, err := ReadToken(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return tok, err
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok = hex.EncodeToString(b)
	// Durable before any client is given it: a power cut must not bring
	// the coordinator back with another token than its workers hold. Of
	// coordinators of a cluster started at once on one --token-file, the
	// first makes it and the others take it.
	created, err := checkpoint.CreateFilePerm(path, []byte(tok+"\n"), 0o600)
	if err != nil {
		return "", err
	}
	if !created {
		return ReadToken(path)
	}
	return tok, nil
}

// ReadToken reads a coordinator's token file (its first line).
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// TokenReader is a nats.TokenHandler for a client: it reads the token
// file at every (re)connection, so that a coordinator restarted with a new
// token (its file lost to a power cut before it was durable) is followed,
// and keeps the last token read while the file cannot be.
func TokenReader(path string) func() string {
	var mu sync.Mutex
	last := ""
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		if tok, err := ReadToken(path); err == nil {
			last = tok
		}
		return last
	}
}

// TokenFile is the file clients read the token from, or "" when the
// coordinator takes clients without one (Config.Auth unset).
func (c *Coordinator) TokenFile() string {
	if !c.cfg.Auth {
		return ""
	}
	if c.cfg.TokenFile != "" {
		return c.cfg.TokenFile
	}
	return filepath.Join(c.cfg.StoreDir, TokenName)
}
