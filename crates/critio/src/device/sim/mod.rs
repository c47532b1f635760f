//! `sim`: simulated HDD and SSD (being written for issue 3).
