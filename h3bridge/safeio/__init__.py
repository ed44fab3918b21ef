"""The one way h3bridge does each risky thing with what a user (or a hub, or a client) hands it.

Every command, request model, storyboard key and node input goes through these modules instead
of its own code, so a rule kept here (never wait on a FIFO, never replace a device node, never
unpack without a cap, never wait on a silent server, never turn a 5,000-digit number into a
traceback) is kept everywhere at once:

* `paths`: open a path the user named for reading, only if it is the kind of file expected;
* `outputs`: write an output atomically, never over anything but a regular file;
* `archives`: unpack an archive with tarfile's data filter and caps on size and member count;
* `http`: fetch over HTTP with connect and read timeouts, a deadline and no more bytes than declared;
* `numbers`: read a number from text or JSON: bounded digits, finite, in range, the field named.

This package sits below every other one and imports nothing of h3bridge but `errors`.
"""
