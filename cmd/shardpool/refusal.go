package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// refusal watches a worker's connection for a coordinator that no longer
// takes it. A worker rides out coordinator restarts, but the one that
// answers after a restart may refuse its token (a coordinator started anew
// with another --data, or its token file replaced) or fail its pinned
// certificate authority. nats.go then closed the connection on the second
// refusal, and the worker went on forever with a connection that could
// never come back, logging "connection closed" twice a second.
//
// Now a refused connection keeps trying, reading the token file again at
// every try (a token copied anew is taken up), the worker says once what
// happened and what to do, and it stops with exit 1 when it is still
// refused after --connect-wait.
type refusal struct {
	url string
	acc access

	// nc is the connection, once made: a certificate the coordinator's
	// new authority signed fails the handshake of each reconnect, which
	// nats.go reports to no handler, only as the connection's last error.
	nc *nats.Conn

	mu     sync.Mutex
	since  time.Time // when the refusals began; zero while none
	err    error     // the last refusal
	closed error     // why the connection closed, where it did
	poke   chan struct{}
}

func newRefusal(url string, acc access) *refusal {
	return &refusal{url: redactURL(url), acc: acc, poke: make(chan struct{}, 1)}
}

// options are the connection's options for it: refusals do not close the
// connection, and every error is seen here.
func (r *refusal) options(stderr io.Writer) []nats.Option {
	return []nats.Option{
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if !r.note(err) {
				fmt.Fprintf(stderr, "nats: %s\n", strings.TrimPrefix(err.Error(), "nats: ")) // as nats.go's own handler
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { r.note(err) }),
		nats.ReconnectHandler(func(*nats.Conn) { r.clear() }),
		nats.ClosedHandler(func(nc *nats.Conn) {
			r.mu.Lock()
			r.closed = fmt.Errorf("its connection to the coordinator at %s closed (%v)", r.url, nc.LastError())
			r.mu.Unlock()
			r.wake()
		}),
	}
}

// note records err where it is a refusal of this client's token or of the
// coordinator's certificate, and says whether it was one.
func (r *refusal) note(err error) bool {
	if err == nil || !(isAuthError(err) || isCertError(err)) {
		return false
	}
	r.mu.Lock()
	if r.since.IsZero() {
		r.since = time.Now()
	}
	r.err = err
	r.mu.Unlock()
	r.wake()
	return true
}

func (r *refusal) clear() {
	r.mu.Lock()
	r.since, r.err = time.Time{}, nil
	r.mu.Unlock()
}

func (r *refusal) wake() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// why is what the refusal means and how to end it.
func (r *refusal) why(err error) string {
	if isCertError(err) {
		return fmt.Sprintf("the coordinator at %s is not the one whose certificate authority is %s (%v): another coordinator, or its store made anew; copy its ca.pem and token (DATA/jetstream/ of its --data) over %s and %s, which are read again at every try",
			r.url, absPath(r.acc.ca), err, absPath(r.acc.ca), absPath(r.acc.token))
	}
	// nats.go's own error or the server's words, as they came first.
	said := strings.ToLower(strings.TrimPrefix(err.Error(), "nats: "))
	if r.acc.token == "" {
		return fmt.Sprintf("the coordinator at %s refuses this worker now (%s): it asks for a token; pass --token-file FILE, DATA/jetstream/token of its --data", r.url, said)
	}
	return fmt.Sprintf("the coordinator at %s refuses this worker now (%s): its token is no longer the one in %s (a coordinator started anew with another --data, or its token replaced); copy DATA/jetstream/token of its --data there, which is read again at every try",
		r.url, said, absPath(r.acc.token))
}

// watch says once that the coordinator refuses the connection, and calls
// stop with the reason once it has for wait, or once the connection has
// closed. It returns when ctx ends.
func (r *refusal) watch(ctx context.Context, wait time.Duration, stderr io.Writer, stop func(error)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	told := time.Time{}
	for {
		if r.nc != nil && r.nc.IsReconnecting() {
			r.note(r.nc.LastError())
		}
		r.mu.Lock()
		since, err, closed := r.since, r.err, r.closed
		r.mu.Unlock()
		switch {
		case closed != nil:
			stop(closed)
			return
		case since.IsZero():
			if !told.IsZero() {
				fmt.Fprintf(stderr, "the coordinator at %s takes this worker again\n", r.url)
				told = time.Time{}
			}
		case time.Since(since) >= wait:
			stop(fmt.Errorf("%s; refused for %s (--connect-wait), so it stops", r.why(err), time.Since(since).Round(time.Second)))
			return
		case told.IsZero():
			fmt.Fprintf(stderr, "%s; it stops if still refused after %s (--connect-wait); its running shards go on meanwhile\n", r.why(err), wait)
			told = since
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.poke:
		}
	}
}
