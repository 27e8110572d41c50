package testenv

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RequireUnheardStartEnds sends request (a session init's exec request,
// its process's stdio with it) on the init's exec socket sock, from a
// connection whose reading side is shut: the start reply fails as a
// daemon's hang-up would make it fail. The init must end the process it
// started (nobody would watch or end it): its stdout, the pipe's only
// other write end, reaches EOF.
func RequireUnheardStartEnds(t testing.TB, sock string, request []byte) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	err = c.CloseRead()
	if err == nil {
		_, _, err = c.WriteMsgUnix(request, unix.UnixRights(int(null.Fd()), int(w.Fd()), int(w.Fd())), nil)
	}
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the process whose start reply could not be sent still runs (read: %v)", err)
	}
}
