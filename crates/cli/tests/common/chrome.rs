//! Headless Chromium for the page's tests: started, waited on, clicked,
//! photographed.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

use super::page::Served;

/// Chromium started headless for a test, with a window large enough for
/// the page's three columns.
pub fn launch(bin: PathBuf) -> Browser {
    Browser::new(LaunchOptions {
        path: Some(bin),
        headless: true,
        // Root in a container: Chromium's sandbox cannot start there.
        sandbox: false,
        window_size: Some((1400, 860)),
        idle_browser_timeout: Duration::from_secs(300),
        ..LaunchOptions::default()
    })
    .unwrap()
}

/// Waits, bounded, until `js` (an expression) is true in the page.
pub fn until(tab: &Tab, js: &str, what: &str) {
    for _ in 0..600 {
        let v = tab.evaluate(js, false).unwrap().value;
        if v == Some(serde_json::Value::Bool(true)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = tab
        .evaluate("document.body.innerText", false)
        .ok()
        .and_then(|r| r.value);
    panic!("gave up after 60 s waiting for {what} ({js}); the page says: {text:?}");
}

pub fn click(tab: &Tab, selector: &str) {
    tab.wait_for_element_with_custom_timeout(selector, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{selector}: {e}"))
        .click()
        .unwrap_or_else(|e| panic!("click {selector}: {e}"));
}

pub fn screenshot(tab: &Tab, name: &str) {
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("page-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
    eprintln!("screenshot: {}", dir.join(name).display());
}

/// A JavaScript string literal.
pub fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A tab on the page `s` serves, loaded with its token.
pub fn open_page(browser: &Browser, s: &Served) -> std::sync::Arc<Tab> {
    let tab = browser.new_tab().unwrap();
    tab.navigate_to(&format!("http://{}/?t={}", s.addr, s.token))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    tab
}
