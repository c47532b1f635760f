//! `pool`: pread/pwrite on per-class worker threads (being written for issue 3).
