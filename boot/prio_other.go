//go:build !linux

package boot

import (
	"errors"
	"net"
)

func pinAndRaise(int) (func(), error) {
	return func() {}, errors.New("thread priority is only set on Linux")
}

type readyWaiter struct{}

func newReadyWaiter(*net.UDPConn, int) (*readyWaiter, error) {
	return nil, errors.New("waiting on a socket from its own thread is only done on Linux")
}

func (*readyWaiter) wait() bool { return true }

func newStopFD() (int, error) { return -1, nil }
func signalStop(int)          {}
func closeStopFD(int)         {}
