package coordinator

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

func (c *Coordinator) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", c.serveStatus)
	mux.HandleFunc("GET /status/{run}", c.serveStatus)
	mux.HandleFunc("GET /metrics", c.serveMetrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if hs := c.srv.Healthz(nil); hs == nil || hs.Status != "ok" {
			http.Error(w, "jetstream not healthy", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}

// authorized lets a status request through when the coordinator asks no
// token (Config.Auth off) or the request carries it as a bearer token. A
// run's status names its paths, inputs and the last line each failed
// shard printed: not for every user who can reach the port. /healthz
// stays open for schedulers and probes.
func (c *Coordinator) authorized(w http.ResponseWriter, r *http.Request) bool {
	if c.token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(c.token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="shardpool"`)
	http.Error(w, fmt.Sprintf("send the coordinator's token: Authorization: Bearer <the token in %s>", c.TokenFile()), http.StatusUnauthorized)
	return false
}

func (c *Coordinator) serveStatus(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(w, r) {
		return
	}
	run := strings.TrimSpace(r.PathValue("run"))
	st, err := ReadStatus(r.Context(), c.js, run)
	if errors.Is(err, ErrRunNotFound) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(st)
}
