package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a running billing-consumer subprocess.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs bin with args and exactly env (plus PATH), its output
// appended to logTo.
func Start(bin string, args []string, env []string, logTo io.Writer) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout = logTo
	cmd.Stderr = logTo
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id, for reading its resources from /proc.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// WaitReady polls http://addr/readyz until it answers 200 (the consumer is
// a group member with a working database), the process exits, or ctx
// ends.
func (p *Process) WaitReady(ctx context.Context, addr string) error {
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get("http://" + addr + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("exited before it was ready: %v", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for a clean exit; it returns
// the exit error (nil for exit code 0).
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.Kill()
		return errors.New("did not stop within the shutdown timeout; killed")
	}
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Wait waits for the process to end or ctx to be done.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
