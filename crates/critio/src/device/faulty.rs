//! `faulty`: fault injection around any device (being written for issue 3).
