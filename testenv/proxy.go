package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections on a loopback address to a target, and
// can hold every byte in both directions (Pause) as a network partition
// does: connections stay open, nothing is lost, and what was sent
// arrives once the partition heals (Resume), as TCP retransmits it. Closed
// at cleanup.
type Proxy struct {
	Addr   string
	target string
	l      net.Listener
	mu     sync.Mutex
	paused bool
	resume *sync.Cond
	conns  []net.Conn
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l}
	p.resume = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Pause holds the traffic of every connection, open and new.
func (p *Proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume lets the held traffic through.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.resume.Broadcast()
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	p.wait()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, u)
	p.mu.Unlock()
	go p.pipe(u, c)
	p.pipe(c, u)
}

// pipe copies src to dst, holding each chunk while paused.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		p.wait()
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: close both ends
		}
	}
}

func (p *Proxy) wait() {
	p.mu.Lock()
	for p.paused {
		p.resume.Wait()
	}
	p.mu.Unlock()
}

func (p *Proxy) close() {
	p.l.Close()
	p.Resume()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}
