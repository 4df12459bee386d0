//! `GET /dashboard`: the developers' web page, served from files built into
//! the binary (no CDN, nothing fetched at run time). The page signs in with an
//! API key kept in the tab's session storage and talks only to the public
//! `/v0` API, so every action obeys the same rules and scopes as the API.

use axum::{
    Router,
    http::{HeaderValue, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};

/// The page forbids everything but its own files and calls to its own origin:
/// no inline script, no framing, no form posts elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The files of the page, by path under `/dashboard/`.
const FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../dashboard/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../dashboard/app.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../dashboard/style.css")),
];

/// The dashboard's routes, outside `/v0` and without authentication: the
/// page itself holds no data; it asks the API with the key it is given.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/dashboard", get(|| async { file("index.html") }))
        .route("/dashboard/", get(|| async { Redirect::permanent("/dashboard") }))
        .route(
            "/dashboard/{file}",
            get(|axum::extract::Path(name): axum::extract::Path<String>| async move { file(&name) }),
        )
}

fn file(name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(path, _, _)| *path == name) else {
        return crate::error::ApiError::NotFound.into_response();
    };
    let mut response = (*body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page names only files that are served, and nothing its policy
    /// would block: no inline script or style, no markup built from strings.
    #[test]
    fn the_page_uses_only_served_files_and_keeps_to_its_policy() {
        let (_, _, index) = FILES.iter().find(|(path, _, _)| *path == "index.html").unwrap();
        for reference in index.split("\"/dashboard/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(FILES.iter().any(|(path, _, _)| *path == name), "index.html names {name}, which is not served");
        }
        for (path, _, body) in FILES {
            assert!(!body.contains(" style="), "{path} has a style attribute");
            assert!(!body.contains("innerHTML") && !body.contains("outerHTML ="), "{path} writes markup from strings");
            assert!(!body.contains("=\"http") && !body.contains("url(http"), "{path} loads from elsewhere");
        }
        assert!(!index.contains("<script>"), "index.html has an inline script");
        assert!(!index.contains("<style"), "index.html has an inline style");
    }

    #[test]
    fn files_are_served_with_the_policy_and_unknown_ones_are_404() {
        let response = file("app.js");
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], POLICY);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(file("../Cargo.toml").status(), 404);
        assert_eq!(file("nothing.js").status(), 404);
    }
}
