// Package hostcheck refuses HTTP requests whose Host header names an
// address the listener does not serve. A web page can make a browser send
// requests to 127.0.0.1 under a name it controls (DNS rebinding: evil.example
// resolves to 127.0.0.1); such requests carry Host: evil.example, and
// refusing them keeps every page but our own out of our loopback servers.
//
// Two policies: For(addr) allows exactly the addresses a TCP listener
// serves (its host:port, and for a loopback or unspecified host the
// loopback spellings 127.0.0.1, localhost and [::1] with its port); Loopback
// allows any loopback IP literal or localhost with any port (the daemon is
// reached through whichever port Docker published). Neither sends CORS
// grants: a refused request gets a plain 421 and no Access-Control header.
// The package depends only on the standard library (the static daemon
// links it).
package hostcheck
