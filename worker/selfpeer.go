package worker

import (
	"bufio"
	"context"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc/peer"
)

// fromThisProcess reports whether the gRPC call came over a TCP connection
// whose client end is a socket of this very process (Temporal's in-process
// system worker). It matches the peer's address against the local
// addresses of this process's sockets in /proc/self/net/tcp{,6}, keeping
// only sockets whose inode is one of /proc/self/fd. Only calls without the
// token pay for the lookup.
func fromThisProcess(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	ta, ok := p.Addr.(*net.TCPAddr)
	if !ok || !ta.IP.IsLoopback() {
		return false
	}
	inodes := socketInodes()
	if len(inodes) == 0 {
		return false
	}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		if ownsLocal(table, ta, inodes) {
			return true
		}
	}
	return false
}

func socketInodes() map[string]bool {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	out := make(map[string]bool, len(fds))
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	return out
}

// ownsLocal: a line of table has local address addr and one of inodes.
func ownsLocal(table string, addr *net.TCPAddr, inodes map[string]bool) bool {
	f, err := os.Open(table)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 10 || !inodes[fl[9]] {
			continue
		}
		ip, port, ok := parseProcAddr(fl[1])
		if ok && port == addr.Port && ip.Equal(addr.IP) {
			return true
		}
	}
	return false
}

// parseProcAddr parses "0100007F:1F90" (IPv4) or the 32-hex-digit IPv6
// form: the address as 32-bit words in host (little-endian) order.
func parseProcAddr(s string) (net.IP, int, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return nil, 0, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, 0, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return nil, 0, false
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return ip, int(port), true
}
