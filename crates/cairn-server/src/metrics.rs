//! Request counters and latency histograms, and the Prometheus text they are served as.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
pub const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Default, Clone)]
struct Series {
    count: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

/// Requests by route, method and status, with latency histograms by route and method.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Series>>,
}

impl Metrics {
    /// Records one request.
    pub fn record(&self, route: &str, method: &str, status: u16, took: Duration) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((route.to_owned(), method.to_owned(), status))
                .or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let s = l.entry((route.to_owned(), method.to_owned())).or_default();
            let secs = took.as_secs_f64();
            s.count += 1;
            s.sum += secs;
            for (i, b) in BUCKETS.iter().enumerate() {
                if secs <= *b {
                    s.buckets[i] += 1;
                }
            }
        }
    }

    /// The Prometheus text exposition of the request metrics.
    pub fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP cairn_http_requests_total HTTP requests by route, method and status.\n",
        );
        out.push_str("# TYPE cairn_http_requests_total counter\n");
        if let Ok(r) = self.requests.lock() {
            for ((route, method, status), n) in r.iter() {
                let _ = writeln!(
                    out,
                    "cairn_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        out.push_str(
            "# HELP cairn_http_request_duration_seconds HTTP request latency by route and method.\n",
        );
        out.push_str("# TYPE cairn_http_request_duration_seconds histogram\n");
        if let Ok(l) = self.latency.lock() {
            for ((route, method), s) in l.iter() {
                let labels = format!("route=\"{}\",method=\"{method}\"", escape(route));
                for (i, b) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "cairn_http_request_duration_seconds_bucket{{{labels},le=\"{b}\"}} {}",
                        s.buckets[i]
                    );
                }
                let _ = writeln!(
                    out,
                    "cairn_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                    s.count
                );
                let _ = writeln!(
                    out,
                    "cairn_http_request_duration_seconds_sum{{{labels}}} {}",
                    s.sum
                );
                let _ = writeln!(
                    out,
                    "cairn_http_request_duration_seconds_count{{{labels}}} {}",
                    s.count
                );
            }
        }
    }
}

/// Escapes a label value.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counts_add_up() {
        let m = Metrics::default();
        m.record("/v1/search", "POST", 200, Duration::from_millis(3));
        m.record("/v1/search", "POST", 200, Duration::from_millis(30));
        m.record("/v1/search", "POST", 422, Duration::from_micros(100));
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains(
            "cairn_http_requests_total{route=\"/v1/search\",method=\"POST\",status=\"200\"} 2"
        ));
        assert!(out.contains(
            "cairn_http_request_duration_seconds_bucket{route=\"/v1/search\",method=\"POST\",le=\"0.005\"} 2"
        ));
        assert!(out.contains(
            "cairn_http_request_duration_seconds_bucket{route=\"/v1/search\",method=\"POST\",le=\"+Inf\"} 3"
        ));
        assert!(out.contains(
            "cairn_http_request_duration_seconds_count{route=\"/v1/search\",method=\"POST\"} 3"
        ));
    }
}
