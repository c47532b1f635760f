//! The metrics endpoint end to end: a server on an in-memory store with
//! `metrics` on, a few SETs and GETs, then `/metrics` scraped over a plain
//! socket as Prometheus would, other paths and methods refused, a busy
//! metrics address refused at start, the endpoint gone after a stop, and
//! a write cache's figures exported when there is one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use critio::device::DeviceSpec;
use critio::nvwc::NvwcConfig;
use critio_kv::engine::EngineConfig;
use critio_kv::server::{Backend, Server, ServerConfig};
use critio_kv::stack::{default_critio_config, Stack, StackConfig, WriteCacheSpec};
use redis::Commands;

const MIB: u64 = 1 << 20;

fn stack_config() -> StackConfig {
    let mut critio = default_critio_config();
    critio.cache.capacity_bytes = 4 * MIB;
    critio.log.record_bytes_max = 256 << 10;
    critio.log.batch_bytes_max = MIB;
    critio.log.pending_bytes_max = 2 * MIB;
    StackConfig {
        device: DeviceSpec::Mem,
        capacity: 64 * MIB,
        critio,
        engine: EngineConfig {
            log_bytes: 4 * MIB,
            value_bytes_max: 64 << 10,
            checkpoint_interval_ms: 200,
            ..EngineConfig::default()
        },
        ..StackConfig::default()
    }
}

fn server_config(metrics: &str) -> ServerConfig {
    ServerConfig {
        bind: "127.0.0.1:0".into(),
        metrics: metrics.into(),
        ..ServerConfig::default()
    }
}

/// One HTTP request over a fresh connection: (status line, headers, body).
fn http(addr: SocketAddr, request: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    let (head, body) = got.split_once("\r\n\r\n").expect("a response head");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_owned(), body.to_owned())
}

/// The value of the sample line that starts with `series ` (name and
/// labels exactly as exposed).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn metrics_are_scraped_over_http_and_stop_with_the_server() {
    let sc = stack_config();
    let stack = Stack::open(&sc).unwrap();
    let server = Server::start(server_config("127.0.0.1:0"), Backend::of(&stack, &sc)).unwrap();
    let metrics = server.metrics_addr().expect("metrics are on");
    assert_ne!(metrics.port(), 0, "the port chosen is reported");

    let client = redis::Client::open(format!("redis://{}/", server.local_addr())).unwrap();
    let mut c = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    for i in 0..20 {
        let _: () = c.set(format!("k{i}"), vec![b'v'; 1000]).unwrap();
    }
    for i in 0..20 {
        let v: Vec<u8> = c.get(format!("k{i}")).unwrap();
        assert_eq!(v.len(), 1000);
    }
    // Whether a SET's log write ran critical depends on whether its worker
    // had to wait for it; a SAVE writes in the (foreground) worker itself.
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();

    let (status, headers, body) = http(
        metrics,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK", "{headers}");
    assert!(
        headers.contains("Content-Type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let critical = sample(&body, "critio_block_completions_total{class=\"critical\"}")
        .unwrap_or_else(|| panic!("no critical completion counter in:\n{body}"));
    assert!(
        critical > 0.0,
        "the SAVE's writes at least are critical:\n{body}"
    );
    assert!(
        body.contains("# TYPE critio_block_device_time_seconds histogram"),
        "{body}"
    );
    assert!(
        body.contains("critio_block_device_time_seconds_bucket{class=\"critical\",le=\"+Inf\"}"),
        "{body}"
    );
    // 41 commands, each in a round of its own (one client, waiting for
    // each reply): a round per command in each part's histogram.
    for part in ["run", "commit", "send"] {
        let key = format!("critio_kv_round_seconds_count{{part=\"{part}\"}}");
        assert!(
            sample(&body, &key).is_some_and(|n| n >= 41.0),
            "no {key} of at least 41 in:\n{body}"
        );
    }
    // Every critical request waited in the block layer's queue (if only
    // for no time): a wait-point histogram of the critical class.
    assert!(
        body.contains("# TYPE critio_wait_seconds histogram"),
        "{body}"
    );
    let queued = "critio_wait_seconds_count{point=\"block: queue\",class=\"critical\"}";
    assert!(
        sample(&body, queued).is_some_and(|n| n > 0.0),
        "no {queued} in:\n{body}"
    );
    assert!(
        body.lines().any(|l| l.starts_with(
            "critio_wait_seconds_bucket{point=\"block: queue\",class=\"critical\",le=\"0.001\"}"
        )),
        "{body}"
    );
    assert!(
        sample(&body, "critio_inherit_boosts_total{kind=\"condvar\"}").is_some(),
        "{body}"
    );
    assert!(sample(&body, "critio_cache_hits_total").is_some(), "{body}");
    assert!(
        sample(&body, "critio_block_cap_stalls_total").is_some(),
        "{body}"
    );
    assert!(
        sample(&body, "critio_background_cpu_floor_raises_total").is_some(),
        "{body}"
    );
    assert!(
        sample(&body, "critio_log_records_total").is_some_and(|n| n > 0.0),
        "{body}"
    );
    assert_eq!(sample(&body, "critio_kv_keys"), Some(20.0), "{body}");
    // A job's progress is a sample only while it runs.
    assert!(
        body.contains("# TYPE critio_kv_job_progress_ratio gauge"),
        "{body}"
    );
    assert!(
        !body.contains("critio_kv_job_progress_ratio{"),
        "no job runs:\n{body}"
    );

    let (status, _, _) = http(metrics, "GET /other HTTP/1.1\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, headers, _) = http(
        metrics,
        "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains("Allow: GET, HEAD"), "{headers}");

    // A client that connects and sends nothing holds the endpoint for its
    // read timeout at most.
    let silent = TcpStream::connect(metrics).unwrap();
    let (status, _, _) = http(metrics, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK");
    drop(silent);

    assert_eq!(server.shutdown(), 0);
    assert!(
        TcpStream::connect_timeout(&metrics, Duration::from_secs(1)).is_err(),
        "the endpoint stops with the server"
    );
}

#[test]
fn a_busy_metrics_address_fails_the_start_and_names_it() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let sc = stack_config();
    let stack = Stack::open(&sc).unwrap();
    let err = Server::start(server_config(&addr), Backend::of(&stack, &sc))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains(&addr) && err.contains("metrics"), "{err}");
    // Off by default; the text is there either way.
    let server = Server::start(server_config(""), Backend::of(&stack, &sc)).unwrap();
    assert_eq!(server.metrics_addr(), None);
    assert!(server
        .metrics_text()
        .contains("# TYPE critio_block_completions_total counter"));
}

#[test]
fn a_write_cache_adds_its_figures() {
    let sc = StackConfig {
        write_cache: Some(WriteCacheSpec {
            device: DeviceSpec::Mem,
            config: NvwcConfig {
                cache_bytes: 4 * MIB,
                ..NvwcConfig::default()
            },
        }),
        ..stack_config()
    };
    let stack = Stack::open(&sc).unwrap();
    let server = Server::start(server_config(""), Backend::of(&stack, &sc)).unwrap();
    let text = server.metrics_text();
    assert!(
        sample(&text, "critio_write_cache_writes_total").is_some(),
        "{text}"
    );
    assert!(
        sample(&text, "critio_write_cache_slots").is_some_and(|n| n > 0.0),
        "{text}"
    );
    let plain = stack_config();
    let stack = Stack::open(&plain).unwrap();
    let server = Server::start(server_config(""), Backend::of(&stack, &plain)).unwrap();
    assert!(!server.metrics_text().contains("critio_write_cache_"));
}
