package harness

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// Tap is asked, for each statement a client is about to send through a
// PGProxy, whether to cut the connection instead: the statement then never
// reaches the server. sql is the statement's text, for a simple query or
// for the execution (Bind) of a statement prepared on that connection. It
// runs on the connection's own goroutine and must return quickly.
type Tap func(sql string) (cut bool)

// SetTap installs tap for the next statements of every connection (nil:
// none). Unlike CutShare it spares no young connection: a process's
// startup ping is no statement it sees.
func (p *PGProxy) SetTap(tap Tap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tap = tap
}

func (p *PGProxy) currentTap() Tap {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tap
}

// Message types of the frontend protocol that name a statement.
const (
	msgQuery = 'Q'
	msgParse = 'P'
	msgBind  = 'B'
)

// Codes of the startup-phase requests that the server answers before the
// real startup message (sslmode=disable sends neither).
const (
	sslRequestCode    = 80877103
	gssencRequestCode = 80877104
)

// forwardClient copies the client's messages to the server one at a time,
// asking the proxy's Tap about each statement first; it returns when
// either side fails or the Tap cut the link. Writes are flushed whenever
// no more client input is buffered, so a batch of messages still goes out
// in one write.
func (p *PGProxy) forwardClient(l *link) {
	r := bufio.NewReaderSize(l.client, 32<<10)
	w := bufio.NewWriterSize(l.server, 32<<10)
	opaque, err := forwardStartup(r, w)
	if err != nil {
		return
	}
	if opaque { // encrypted from here on: no statement can be seen
		_, _ = io.Copy(l.server, r)
		return
	}
	prepared := map[string]string{} // statement name → SQL, on this connection
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, header); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(header[1:])) - 4
		if n < 0 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		var sql string
		switch header[0] {
		case msgQuery:
			sql, _ = cString(body)
		case msgParse:
			name, rest := cString(body)
			prepared[name], _ = cString(rest)
		case msgBind:
			_, rest := cString(body) // the portal
			stmt, _ := cString(rest)
			sql = prepared[stmt]
		}
		if tap := p.currentTap(); sql != "" && tap != nil && tap(sql) {
			p.cutLink(l)
			return
		}
		if _, err := w.Write(header); err != nil {
			return
		}
		if _, err := w.Write(body); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// forwardStartup forwards the untyped first message. After an SSL or GSS
// encryption request the stream may be encrypted, so it is reported
// opaque (the tap works only with sslmode=disable, as the tests run).
func forwardStartup(r *bufio.Reader, w *bufio.Writer) (opaque bool, err error) {
	header := make([]byte, 8)
	if _, err := io.ReadFull(r, header); err != nil {
		return false, err
	}
	n := int(binary.BigEndian.Uint32(header)) - 8
	if n < 0 {
		return false, fmt.Errorf("pg proxy: bad startup length")
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return false, err
	}
	if _, err := w.Write(append(header, body...)); err != nil {
		return false, err
	}
	if err := w.Flush(); err != nil {
		return false, err
	}
	code := binary.BigEndian.Uint32(header[4:])
	return code == sslRequestCode || code == gssencRequestCode, nil
}

// cString splits b at its first NUL: the string before it and the rest.
func cString(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// cutLink cuts one connection now and counts it.
func (p *PGProxy) cutLink(l *link) {
	p.mu.Lock()
	_, live := p.links[l]
	delete(p.links, l)
	if live {
		p.cuts++
	}
	p.mu.Unlock()
	reset(l)
}

// reset closes both sides of l, the client's with a TCP reset.
func reset(l *link) {
	if tc, ok := l.client.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	l.client.Close()
	l.server.Close()
}
