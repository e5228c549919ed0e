//! Prometheus metrics: requests by route and status, latency histograms,
//! and the database pool.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~4 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    db_pool_connections: Gauge,
    db_pool_idle: Gauge,
    /// Heartbeats written by the lease keeper, and its batches.
    lease_renewals: Counter,
    lease_batches: Counter,
    /// Consoles relayed to another replica: people's, agents' dials.
    console_person_relays: Counter,
    console_dial_relays: Counter,
    /// GPUs per model guaranteed beyond those in service.
    overpromised: Family<ModelLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kumo");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let db_pool_connections = Gauge::default();
        let db_pool_idle = Gauge::default();
        let lease_renewals = Counter::default();
        let lease_batches = Counter::default();
        let console_person_relays = Counter::default();
        let console_dial_relays = Counter::default();
        let overpromised = Family::<ModelLabels, Gauge>::default();
        registry.register(
            "gpu_guarantees_overpromised_gpus",
            "GPUs of a model guaranteed to tenants beyond those in service (hosts lost, retired or in repair since they were promised)",
            overpromised.clone(),
        );
        registry.register(
            "console_person_relays",
            "People's consoles relayed to the replica holding the VM's console",
            console_person_relays.clone(),
        );
        registry.register(
            "console_dial_relays",
            "Agents' console dials relayed to the replica a person waits at",
            console_dial_relays.clone(),
        );
        registry.register(
            "host_lease_renewals",
            "Host heartbeats written in batches by the lease keeper",
            lease_renewals.clone(),
        );
        registry.register(
            "host_lease_batches",
            "Batches of host heartbeats written",
            lease_batches.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            latency.clone(),
        );
        registry.register(
            "db_pool_connections",
            "Open connections in the database pool",
            db_pool_connections.clone(),
        );
        registry.register(
            "db_pool_idle_connections",
            "Idle connections in the database pool",
            db_pool_idle.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            db_pool_connections,
            db_pool_idle,
            lease_renewals,
            lease_batches,
            console_person_relays,
            console_dial_relays,
            overpromised,
        }
    }

    /// The models promised beyond their GPUs in service now (others 0).
    pub fn set_overpromised(&self, models: impl IntoIterator<Item = (String, u64)>) {
        self.overpromised.clear();
        for (model, n) in models {
            self.overpromised
                .get_or_create(&ModelLabels { model })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A console relayed to another replica: a person's, or an agent's dial.
    pub fn console_relayed(&self, dial: bool) {
        if dial {
            self.console_dial_relays.inc();
        } else {
            self.console_person_relays.inc();
        }
    }

    /// One batch of `hosts` heartbeats written.
    pub fn lease_batch(&self, hosts: usize) {
        self.lease_renewals.inc_by(hosts as u64);
        self.lease_batches.inc();
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels {
                method: method.to_owned(),
                route: route.to_owned(),
            })
            .observe(seconds);
    }

    pub fn set_pool(&self, connections: u32, idle: u32) {
        self.db_pool_connections.set(i64::from(connections));
        self.db_pool_idle.set(i64::from(idle));
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_show_up_by_route_and_status() {
        let m = Metrics::new();
        m.observe("GET", "/api/v1/tenants/{tenant}", 404, 0.002);
        m.observe("GET", "/api/v1/tenants/{tenant}", 404, 0.003);
        m.set_pool(3, 2);
        let text = m.encode();
        assert!(
            text.contains(r#"kumo_http_requests_total{method="GET",route="/api/v1/tenants/{tenant}",status="404"} 2"#),
            "{text}"
        );
        assert!(text.contains("kumo_http_request_duration_seconds_bucket"));
        assert!(text.contains("kumo_db_pool_connections 3"));
    }
}
