//! `uring`: io_uring with O_DIRECT (being written for issue 3).
