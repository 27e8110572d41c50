// Package command is the daemon's command engine: it runs shell commands
// through an injected Starter, keeps their output as lines, and answers
// exec_command, write_command_stdin, read_command_lines, cancel_command and
// resize_command. It knows nothing about containers: the Starter decides
// where a process runs (a workspace session in production, the host in
// tests).
//
// Invariants:
//
//   - Command ids are "cmd_" + 16 hex digits from crypto/rand: unguessable,
//     unlike the seed's sequential ids. An unknown or evicted id is a
//     not_found error ("command not found: <id>") for every operation.
//   - Every command ends: timeout_ms defaults to api.DefaultTimeoutMS and is
//     clamped to api.MaxTimeoutMS. Ending on behalf of the engine (timeout,
//     cancel, shutdown) is SIGTERM to the process group, then SIGKILL after
//     a grace. The first reason wins and fixes the status: cancelled (130)
//     or timed_out (124), whatever the process's own exit status was.
//     Otherwise exit 0 is ok and anything else is error, with -N for death
//     by signal N and 128 when the exit status could not be learned.
//   - Completion: the engine owns the output pipes and closes its write ends
//     when the main process's Wait returns. The command is terminal once
//     every output pipe reached EOF, or DrainGrace (100ms) after Wait when a
//     background child still holds one: background children never pin a
//     command (the seed's did). What such a child writes afterwards is read
//     and discarded, so it does not die of SIGPIPE, until it closes the pipe
//     or the engine shuts down, or until MaxLingering (256) such pipes are
//     drained: then the oldest is closed, and its child gets EPIPE (SIGPIPE)
//     if it writes again. So background children cost the daemon at most
//     MaxLingering descriptors and goroutines, outside MaxRunning; a
//     destroyed session's children are killed, which closes theirs.
//   - Output is split into lines at "\n" ("\r\n" counts as "\n"; a lone "\r"
//     stays in the text). Offsets are 0-based and global per command, in
//     arrival order across stdout and stderr (the two pipes are read
//     concurrently, so lines written close together to different streams
//     may appear in either order). A line longer than 64 KiB is split into
//     several lines at a rune boundary. With a TTY everything is stdout.
//   - Partial lines: while a command runs, the bytes after a stream's last
//     newline are shown after the window's last line, with tentative offsets
//     from total_lines on; they are not counted in total_lines or end_offset
//     and do not move the yield cursor, so the completed line is returned
//     again, whole, once its newline arrives. When the command ends, a
//     trailing partial line becomes a final line.
//   - Memory: a command keeps at most MaxBytes of output (line text plus 8
//     bytes per line); beyond that the oldest lines are dropped, offsets keep
//     counting, and a response whose window would have started among dropped
//     lines says truncated. Its arrays hold about 1.25 × what it keeps
//     while it runs (at most 1.5 × when its lines' lengths change: room is
//     released when the arrays are moved); spare capacity is released when
//     it ends. At most Retained finished commands are kept; the oldest
//     finished one is evicted first and running ones never are.
//   - Budget: the memory all commands' output holds together, running ones
//     included, is at most OutputBudget, counted by what it holds (the
//     arrays' capacity and the unterminated tails), as it is read, not only
//     when a command ends. Past it, first the oldest finished commands lose
//     their lines (status, exit code and counts stay; reads say truncated
//     and output_dropped, naming the budget); then the output a running
//     command may keep is lowered below MaxBytes to what is left, shared by
//     water level (commands holding less keep all of theirs, the largest
//     are cut to one level, an eighth below the budget), and they drop
//     their oldest lines as MaxBytes makes them (reads say truncated). New
//     commands are not refused for it. The limit rises again, towards
//     MaxBytes, as commands end. The one exception: a running command
//     always keeps its newest line and unterminated tails and is not cut
//     below 64 KiB, so it holds up to about 350 KiB whatever the budget:
//     more than OutputBudget is held only if MaxRunning commands at that
//     floor pass it (with the defaults, 512 × 350 KiB, they do not).
//   - At most MaxRunning commands run at once; Start refuses one more with
//     resource_exhausted (details.limit "max_running_commands"). A start
//     that fails gives its slot back.
//   - Yields (Start, WriteStdin, Cancel) wait up to the yield time for the
//     command to end. A running yield returns the lines since the command's
//     cursor and moves the cursor past them; a terminal one returns the
//     lines since the cursor without moving it, so asking again gives the
//     same answer. A yield returns at most api.MaxReadLimit lines and
//     MaxResponseBytes of text, the newest ones, and says truncated when it
//     skipped some (Read pages through them). command_session_id is set
//     while running and on truncated terminal responses; Read always sets it
//     and never moves the cursor.
//   - OnExit runs exactly once per started command, after the terminal state
//     and final output are recorded and the command left Active. No response
//     shows the terminal state before it returned: yields and Read wait for
//     it (a call whose context ends first sees the command still running),
//     so what it attaches with SetResult is in every terminal response,
//     whichever call returns it. SetResult functions are applied, in order,
//     to every later response about the command. Meta.Started runs before
//     Start yields, so a caller's admission lock is released before OnExit
//     can need it.
//   - stdin: without a TTY, \x03 or \x04 anywhere in write_command_stdin
//     cancels (the seed's rule); with a TTY bytes go to the terminal as they
//     are (^C becomes SIGINT through the line discipline). One write may
//     block at most StdinDeadline (2s), then fails with details.reason
//     "stdin_backpressure". CloseStdin sends EOF.
//   - Lock order: Engine.mu before command.mu; neither is held while calling
//     a Starter, a Process method, OnExit or a SetResult function.
package command
