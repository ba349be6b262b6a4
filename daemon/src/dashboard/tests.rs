#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::io::{Read as _, Write as _};

use super::guard::{CSP, Token, constant_time_eq};
use super::*;

/// Serves the pages and a stand-in `/api/ping` behind the guard; returns the address.
async fn serve(token: Option<Token>) -> std::net::SocketAddr {
    let app = guarded(
        assets(token.is_some()).route("/api/ping", get(|| async { "pong" })),
        token,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// One raw HTTP/1.1 request; the status, the head and the body.
async fn request(addr: std::net::SocketAddr, raw: String) -> (u16, String, String) {
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_owned())
    })
    .await
    .unwrap()
}

fn get_req(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n")
}

#[tokio::test]
async fn every_response_carries_the_csp_and_no_cors() {
    let addr = serve(None).await;
    for path in [
        "/",
        "/app.js",
        "/app.css",
        "/favicon.svg",
        "/auth",
        "/api/ping",
        "/nothing",
    ] {
        let (status, head, _) =
            request(addr, get_req(path, "Origin: https://evil.example\r\n")).await;
        assert!(status == 200 || path == "/nothing", "{path}: {status}");
        assert!(
            head.contains(&format!(
                "content-security-policy: {}",
                CSP.to_ascii_lowercase()
            )),
            "{path}: {head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{path}");
        assert!(head.contains("x-frame-options: deny"), "{path}");
        assert!(!head.contains("access-control-"), "{path}: {head}");
    }
    assert!(CSP.contains("default-src 'self'") && CSP.contains("script-src 'self'"));
    assert!(!CSP.contains("unsafe-inline") && !CSP.contains("unsafe-eval"));
    let (status, _, body) = request(addr, get_req("/nothing", "")).await;
    assert_eq!((status, body.as_str()), (404, "no such page\n"));
}

#[tokio::test]
async fn only_get_and_head_are_served() {
    let token = Token::parse("s3cret\n").unwrap();
    let addr = serve(Some(token)).await;
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        for path in ["/", "/api/ping", "/nothing"] {
            let raw = format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\nAuthorization: Bearer s3cret\r\n\r\n"
            );
            let (status, head, _) = request(addr, raw).await;
            assert_eq!(status, 405, "{method} {path}");
            assert!(head.contains("allow: get, head"), "{method} {path}: {head}");
            assert!(head.contains("content-security-policy"), "{method} {path}");
        }
    }
    let raw = "HEAD / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned();
    assert_eq!(request(addr, raw).await.0, 200);
}

#[tokio::test]
async fn the_api_needs_the_token_and_the_pages_do_not() {
    let addr = serve(Some(Token::parse("s3cret").unwrap())).await;
    let (status, head, _) = request(addr, get_req("/api/ping", "")).await;
    assert_eq!(status, 401);
    assert!(head.contains("www-authenticate: bearer"));
    for wrong in [
        "Authorization: Bearer s3cre\r\n",
        "Authorization: Bearer s3cret2\r\n",
        "Authorization: Bearer S3CRET\r\n",
        "Authorization: Basic s3cret\r\n",
        "Authorization: s3cret\r\n",
        "Authorization: Bearer \r\n",
    ] {
        assert_eq!(
            request(addr, get_req("/api/ping", wrong)).await.0,
            401,
            "{wrong}"
        );
    }
    for right in [
        "Authorization: Bearer s3cret\r\n",
        "Authorization: bearer s3cret\r\n",
    ] {
        let (status, _, body) = request(addr, get_req("/api/ping", right)).await;
        assert_eq!((status, body.as_str()), (200, "pong"), "{right}");
    }
    // The pages hold no data: served without it, and they learn that the API needs it.
    assert_eq!(request(addr, get_req("/", "")).await.0, 200);
    let (_, _, body) = request(addr, get_req("/auth", "")).await;
    assert_eq!(body, r#"{"token":true}"#);
    let open = serve(None).await;
    assert_eq!(request(open, get_req("/api/ping", "")).await.0, 200);
    assert_eq!(
        request(open, get_req("/auth", "")).await.2,
        r#"{"token":false}"#
    );
}

#[test]
fn tokens_compare_whole() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(constant_time_eq(b"", b""));
    for (a, b) in [
        (&b"abc"[..], &b"abd"[..]),
        (b"abc", b"ab"),
        (b"ab", b"abc"),
        (b"", b"a"),
        (b"\0", b""),
    ] {
        assert!(!constant_time_eq(a, b), "{a:?} {b:?}");
    }
    assert!(Token::parse("\n").is_none());
    assert!(Token::parse("  \nsecond").is_none(), "the first line only");
    assert!(
        format!("{:?}", Token::parse("s3cret").unwrap())
            .find("s3cret")
            .is_none()
    );
}

#[test]
fn the_token_file_must_hold_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    let missing = read_token(&path).unwrap_err();
    assert!(crate::chain(&missing).contains("reading the dashboard token file"));
    std::fs::write(&path, "\n").unwrap();
    let empty = read_token(&path).unwrap_err();
    assert!(
        crate::chain(&empty).contains("is empty"),
        "{}",
        crate::chain(&empty)
    );
    std::fs::write(&path, "tok\n").unwrap();
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(header::AUTHORIZATION, "Bearer tok".parse().unwrap());
    assert!(read_token(&path).unwrap().admits(&headers));
}

/// Data reaches the page through `textContent` only: the script never builds HTML, and the
/// page has no inline script or style the CSP would refuse.
#[test]
fn the_pages_never_build_html_from_data() {
    let js = include_str!("assets/app.js");
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "setAttribute('on",
        ".style.",
    ] {
        assert!(!js.contains(sink), "app.js uses {sink}");
    }
    assert!(js.contains("textContent"));
    let html = include_str!("assets/index.html");
    assert!(!html.contains("<script>") && !html.contains("style="));
    assert!(!html.contains(" on") || !html.contains("onclick="));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing fetched from elsewhere"
    );
    for script in html.match_indices("<script") {
        assert!(html[script.0..].starts_with("<script src=\"/app.js\""));
    }
}
