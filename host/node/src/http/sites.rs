//! Requests from web pages cannot act: the `Host` a request names and the page it comes from
//! (`Origin`, `Referer`, `Sec-Fetch-Site`) are checked before anything else, sans I/O.
//!
//! - **DNS rebinding.** A page on `evil.example` whose name then resolves to 127.0.0.1 talks
//!   to the node as its own origin, so the browser lets it read answers; but its requests say
//!   `Host: evil.example`. Accepted are IP addresses (a rebinding needs a name), `localhost`,
//!   `node.timeshard` (the fleet certificate's name) and `[http] allowed_hosts`; others: 421.
//! - **Cross-site requests.** The node serves no pages, so no browser request is its own: one
//!   carrying an `Origin` (sent on every cross-origin request and on every POST), a `Referer`
//!   on a body a form can send (older browsers omit `Origin` on form posts), or a
//!   `Sec-Fetch-Site` other than `none` and `same-origin` (a link, an image, a form) is refused
//!   with 403 unless its origin is in `[http] allowed_origins` or is the node's own (the `Host`
//!   it names). Bodies that are not form-like (`application/json`, protobuf) need a CORS
//!   preflight, which the node never grants. Tools (Telegraf, the InfluxDB and Prometheus
//!   clients, curl) send none of these headers and are unaffected.

use axum::http::{HeaderMap, Method, header};
use timeshard_sdk::tls::NODE_NAME;

use super::error::ApiError;
use crate::config::HttpConfig;

/// The hosts and origins a node accepts, lowercased.
#[derive(Clone, Debug)]
pub struct Sites {
    hosts: Vec<String>,
    origins: Vec<String>,
}

impl Sites {
    pub fn new(config: &HttpConfig) -> Sites {
        let mut hosts = vec!["localhost".to_string(), NODE_NAME.to_string()];
        hosts.extend(config.allowed_hosts.iter().map(|h| h.trim_end_matches('.').to_ascii_lowercase()));
        let origins = config.allowed_origins.iter().map(|o| o.trim_end_matches('/').to_ascii_lowercase()).collect();
        Sites { hosts, origins }
    }

    /// Refuses a request naming a host that is not this node's, or sent by a web page.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
        let text = |name: header::HeaderName| {
            headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
        };
        // A request without `Host` (HTTP/1.0) is no browser's: browsers always send it.
        let host = text(header::HOST);
        if let Some(host) = &host
            && !self.host_allowed(host)
        {
            return Err(ApiError::MisdirectedHost(format!(
                "Host {host:?} is not a name of this node: use its IP address or localhost, or add the name to \
                 [http] allowed_hosts (names that are not the node's are refused so that a web page cannot reach \
                 it by DNS rebinding)"
            )));
        }
        let own = |origin: &str| host.as_deref().is_some_and(|h| own_origin(origin, h));
        if let Some(origin) = text(header::ORIGIN) {
            if self.origin_allowed(&origin) || own(&origin) {
                return Ok(());
            }
            return Err(cross_site(&format!("Origin {origin:?}")));
        }
        if formlike(method, headers)
            && let Some(referer) = text(header::REFERER)
        {
            let origin = origin_of(&referer);
            if !(self.origin_allowed(origin) || own(origin)) {
                return Err(cross_site(&format!("a form-like body from Referer {origin:?}")));
            }
        }
        if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
            && !matches!(site.to_ascii_lowercase().as_str(), "none" | "same-origin")
        {
            return Err(cross_site(&format!("Sec-Fetch-Site {site:?} without an allowed Origin")));
        }
        Ok(())
    }

    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
        is_ip(&name) || self.hosts.contains(&name)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        self.origins.contains(&origin)
    }
}

fn cross_site(what: &str) -> ApiError {
    ApiError::CrossSite(format!(
        "a request from a web page ({what}) is refused: the node serves no pages, so a browser request is another \
         site's; call it from a tool or a server, or add the page's origin to [http] allowed_origins"
    ))
}

/// A body a page can send cross-site without a CORS preflight (a form, or text): a POST, PUT
/// or PATCH whose `Content-Type` is missing or one of the three "simple" ones.
fn formlike(method: &Method, headers: &HeaderMap) -> bool {
    if !matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        return false;
    }
    let Some(ct) = headers.get(header::CONTENT_TYPE) else { return true };
    let ct = String::from_utf8_lossy(ct.as_bytes()).to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or("").trim();
    matches!(essence, "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data")
}

/// `host` of `host[:port]` (or of `[v6]:port`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // Unclosed brackets stay as they are: no name or address matches them.
        return match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.starts_with(':') => ip,
            _ => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn is_ip(name: &str) -> bool {
    name.parse::<std::net::IpAddr>().is_ok()
}

/// `scheme://host[:port]` of a URL.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// Whether `origin` is `http(s)://` followed by exactly the `Host` of the request.
fn own_origin(origin: &str, host: &str) -> bool {
    let origin = origin.to_ascii_lowercase();
    let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    rest.is_some_and(|r| r.trim_end_matches('/') == host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn sites() -> Sites {
        Sites::new(&HttpConfig {
            allowed_hosts: vec!["TSDB.plant.example.".into()],
            allowed_origins: vec!["https://grafana.plant.example/".into()],
            ..HttpConfig::default()
        })
    }

    #[test]
    fn hosts_are_ip_addresses_localhost_and_configured_names() {
        let s = sites();
        for ok in [
            "127.0.0.1:8086",
            "[::1]:8086",
            "localhost:8086",
            "LOCALHOST",
            "10.1.2.3",
            "tsdb.plant.example:80",
            "node.timeshard:8086",
        ] {
            s.check(&Method::GET, &headers(&[("host", ok)])).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        s.check(&Method::GET, &HeaderMap::new()).unwrap();
        for bad in ["evil.example:8086", "127.0.0.1.evil.example", "localhost.evil.example:8086", "[::1"] {
            let e = s.check(&Method::GET, &headers(&[("host", bad)])).unwrap_err();
            assert_eq!(e.status(), 421, "{bad}");
            assert!(e.to_string().contains("allowed_hosts"), "{e}");
        }
    }

    #[test]
    fn pages_are_refused_unless_their_origin_is_allowed() {
        let s = sites();
        let host = ("host", "127.0.0.1:8086");
        let refused = |pairs: &[(&'static str, &str)], method: Method| {
            let e = s.check(&method, &headers(pairs)).unwrap_err();
            assert_eq!(e.status(), 403, "{pairs:?}");
            e.to_string()
        };
        assert!(refused(&[host, ("origin", "http://evil.example")], Method::POST).contains("allowed_origins"));
        refused(&[host, ("origin", "null")], Method::GET);
        refused(&[host, ("sec-fetch-site", "cross-site")], Method::GET);
        refused(&[host, ("sec-fetch-site", "same-site")], Method::GET);
        refused(&[host, ("referer", "http://evil.example/page"), ("content-type", "text/plain")], Method::POST);
        refused(&[host, ("referer", "http://evil.example/page")], Method::POST);
        // Allowed: tools, the allowed origin, the node's own origin, a JSON body with a referer
        // (it needed a preflight), a typed-in URL.
        s.check(&Method::POST, &headers(&[host, ("content-type", "text/plain; charset=utf-8")])).unwrap();
        s.check(
            &Method::POST,
            &headers(&[host, ("origin", "https://Grafana.plant.example"), ("sec-fetch-site", "cross-site")]),
        )
        .unwrap();
        s.check(&Method::POST, &headers(&[host, ("origin", "http://127.0.0.1:8086")])).unwrap();
        s.check(
            &Method::POST,
            &headers(&[host, ("referer", "http://x.example/"), ("content-type", "application/x-protobuf")]),
        )
        .unwrap();
        s.check(&Method::GET, &headers(&[host, ("sec-fetch-site", "none")])).unwrap();
    }
}
