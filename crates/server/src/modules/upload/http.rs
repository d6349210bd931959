//! The upload service's HTTP side (XEP-0363 §7, §8): `PUT` into a slot,
//! `GET`/`HEAD` with byte ranges and validators, CORS.

use super::*;

pub(super) fn http_routes(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/", get(index_page))
        .route(
            "/{slot}/{name}",
            get(download).put(upload).options(preflight),
        )
        .with_state(inner)
}

/// CORS for web clients on other origins (§8: "loose CORS headers").
pub(super) fn cors(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(
            "Content-Length, Content-Type, Content-Disposition, Content-Range, Accept-Ranges, ETag, Last-Modified",
        ),
    );
    r
}

/// A short plain-text answer.
pub(super) fn status(code: StatusCode, text: &str) -> Response {
    cors(
        (
            code,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            format!("{text}\n"),
        )
            .into_response(),
    )
}

pub(super) fn not_found() -> Response {
    status(StatusCode::NOT_FOUND, "no such file")
}

pub(super) async fn index_page() -> Response {
    status(
        StatusCode::OK,
        "This is Starling's HTTP upload endpoint (XEP-0363): XMPP clients get upload slots from the upload service and PUT files here.",
    )
}

/// `OPTIONS`: the CORS preflight.
pub(super) async fn preflight() -> Response {
    let mut r = cors(StatusCode::NO_CONTENT.into_response());
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("OPTIONS, HEAD, GET, PUT"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "Authorization, Content-Type, Range, If-Range, If-None-Match, If-Modified-Since",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}

/// The slot of a URL, if the URL is one of ours: a well-formed slot id,
/// metadata we can read, and the file name it was issued for. Anything
/// else (`..`, encoded or not, other names) is "not found".
pub(super) async fn lookup(inner: &Inner, slot: &str, name: &str) -> Option<(PathBuf, Meta)> {
    if !valid_slot_id(slot) {
        return None;
    }
    let dir = inner.slot_dir(slot);
    let meta = read_meta(&dir).await.ok()?;
    (meta.v <= META_VERSION && meta.filename == name).then_some((dir, meta))
}

/// `PUT /upload/{slot}/{name}` (§7).
pub(super) async fn upload(
    State(inner): State<Arc<Inner>>,
    UrlPath((slot, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = store(&inner, &slot, &name, &headers, body).await;
    UploadMetrics::count(&inner.metrics.puts, "status", r.status().as_str());
    r
}

/// The work of [`upload`].
pub(super) async fn store(
    inner: &Inner,
    slot: &str,
    name: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let Some((dir, meta)) = lookup(inner, slot, name).await else {
        return not_found();
    };
    if meta.uploaded.is_some() || tokio::fs::metadata(dir.join(DATA_FILE)).await.is_ok() {
        return status(StatusCode::CONFLICT, "this slot was already used");
    }
    let now = unix_now();
    if now >= meta.created + inner.slot_timeout.as_secs()
        || meta.expire_before.is_some_and(|b| now >= b)
    {
        return status(
            StatusCode::FORBIDDEN,
            "this upload slot expired; request a new one",
        );
    }
    // §7: the service MUST reject a Content-Length other than the size.
    let length = match headers.get(header::CONTENT_LENGTH) {
        None => return status(StatusCode::LENGTH_REQUIRED, "Content-Length is required"),
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => n,
            None => return status(StatusCode::BAD_REQUEST, "bad Content-Length"),
        },
    };
    if length > meta.size {
        return status(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("this slot is for {} bytes", meta.size),
        );
    }
    if length != meta.size {
        return status(
            StatusCode::BAD_REQUEST,
            &format!("this slot is for {} bytes", meta.size),
        );
    }
    // §7: SHOULD reject another type than the one announced.
    if let (Some(announced), Some(given)) = (&meta.content_type, headers.get(header::CONTENT_TYPE))
    {
        let same = MediaType::parse(announced)
            .zip(given.to_str().ok().and_then(MediaType::parse))
            .is_some_and(|(a, g)| a.essence == g.essence);
        if !same {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("this slot is for {announced}"),
            );
        }
    }
    let part = dir.join(PART_FILE);
    let file = match private_file(&part, true).await {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Another PUT is writing it, or one died long ago.
            let stale = age_secs(&part, unix_now())
                .await
                .is_some_and(|a| a >= inner.slot_timeout.as_secs());
            if !stale || tokio::fs::remove_file(&part).await.is_err() {
                return status(
                    StatusCode::CONFLICT,
                    "an upload to this slot is in progress",
                );
            }
            match private_file(&part, true).await {
                Ok(f) => f,
                Err(_) => {
                    return status(
                        StatusCode::CONFLICT,
                        "an upload to this slot is in progress",
                    )
                }
            }
        }
        Err(e) => {
            tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot create an upload file");
            return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
        }
    };
    // Whatever ends this upload (an error, the client going away and the
    // connection dropping this future), the partial file goes with it.
    let _part = PartFile(part.clone());
    let receiving = Held::new(&inner.metrics.receiving);
    if let Err((code, text)) = receive(inner.slot_timeout, file, body, meta.size).await {
        return status(code, &text);
    }
    drop(receiving);
    // One PUT per slot: a hard link fails if the file exists, so of two
    // uploads that both got here, one wins.
    let data = dir.join(DATA_FILE);
    if let Err(e) = tokio::fs::hard_link(&part, &data).await {
        if e.kind() == io::ErrorKind::AlreadyExists {
            return status(StatusCode::CONFLICT, "this slot was already used");
        }
        tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot store an upload");
        return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
    }
    let now = unix_now();
    let done = Meta {
        uploaded: Some(now),
        ..meta
    };
    if let Err(e) = write_meta(&dir, &done).await {
        tracing::error!(module = NAME, slot = %dir.display(), error = %e, "cannot record an upload");
        let _ = tokio::fs::remove_file(&data).await;
        return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot store the file");
    }
    {
        // Under the index's lock, as the sweep that recounts the gauges.
        let mut idx = inner.lock_index();
        idx.mark_uploaded(&done.owner, slot, now);
        inner.metrics.stored_files.inc();
        inner.metrics.stored_bytes.inc_by(done.size as i64);
    }
    inner.metrics.received_bytes.inc_by(done.size);
    tracing::info!(module = NAME, owner = %done.owner, bytes = done.size, "file uploaded");
    // §7: 201 means the file is served from the GET URL from now on.
    cors(StatusCode::CREATED.into_response())
}

/// A `file.part` being written, removed when dropped (by then it is
/// either linked into place or incomplete).
pub(super) struct PartFile(pub(super) PathBuf);

impl Drop for PartFile {
    fn drop(&mut self) {
        // One unlink: quick enough not to matter to the runtime.
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The write buffers of [`UPLOAD_BUFFERS`]: a permit per buffer, and the
/// buffers not lent out. Allocated on first use, freed when the last
/// upload in flight ends.
pub(super) struct UploadBuffers {
    pub(super) permits: tokio::sync::Semaphore,
    pub(super) free: Mutex<Vec<Vec<u8>>>,
}

pub(super) static BUFFERS: UploadBuffers = UploadBuffers {
    permits: tokio::sync::Semaphore::const_new(UPLOAD_BUFFERS),
    free: Mutex::new(Vec::new()),
};

/// Permits for the uploads' `fsync`s ([`UPLOAD_SYNCS`]).
pub(super) static SYNCS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(UPLOAD_SYNCS);

/// Uploads receiving their body now, in this process.
pub(super) static RECEIVING: AtomicUsize = AtomicUsize::new(0);

/// One upload counted in [`RECEIVING`] while it lives; the last one out
/// frees the write buffers.
pub(super) struct Receiving;

impl Receiving {
    pub(super) fn start() -> Receiving {
        RECEIVING.fetch_add(1, Ordering::Relaxed);
        Receiving
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        if RECEIVING.fetch_sub(1, Ordering::Relaxed) == 1 {
            BUFFERS
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
        }
    }
}

/// A write buffer lent to one upload, with its permit.
pub(super) struct Lent {
    pub(super) buf: Vec<u8>,
    pub(super) _permit: tokio::sync::SemaphorePermit<'static>,
}

impl UploadBuffers {
    pub(super) async fn lend(&'static self) -> Lent {
        // The semaphore is never closed.
        let permit = self.permits.acquire().await.expect("never closed");
        let buf = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(UPLOAD_BUFFER));
        Lent {
            buf,
            _permit: permit,
        }
    }

    pub(super) fn give_back(&self, lent: Lent) {
        // The buffer never grows past [`UPLOAD_BUFFER`] (`receive` fills it
        // to its room); the permit goes back as `lent` is dropped.
        let Lent { mut buf, _permit } = lent;
        buf.clear();
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
    }
}

/// Streams the request body into `file`: exactly `size` bytes, each read
/// within the slot timeout, then synced to disk.
///
/// Memory per upload in flight is bounded whatever the number of uploads:
/// the body is read (into hyper's read buffer of the connection, 16 KiB at
/// most, `transport::http`) and copied into one of the [`UPLOAD_BUFFERS`]
/// shared write buffers, which takes what else is already there and is
/// written to the file with one `write` on the blocking pool once full or
/// once the body pauses ([`UPLOAD_FILL_GAP`]). An upload waits for its next
/// bytes without a write buffer, so a slow client holds one for at most
/// that pause after each read; while every
/// buffer is busy the others are not read, and TCP slows their clients
/// down to the disk's pace. Before this, each upload kept the body's own
/// frames (hyper's buffers) until written: ~0.2 MiB per upload in flight
/// with 100 at once (docs/benchmarks.md 2026-11-27, 2026-11-28).
pub(super) async fn receive(
    slot_timeout: Duration,
    file: tokio::fs::File,
    body: Body,
    size: u64,
) -> Result<(), (StatusCode, String)> {
    let _receiving = Receiving::start();
    // Nothing is in flight on a file just opened: this returns at once.
    let mut file = file.into_std().await;
    let mut stream = body.into_data_stream();
    let mut got = 0u64;
    // Part of a frame that did not fit in the previous buffer.
    let mut carried: Option<Bytes> = None;
    let failed = |e: io::Error| {
        tracing::error!(module = NAME, error = %e, "writing an upload failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot store the file".to_owned(),
        )
    };
    let broke = |e: axum::Error| {
        (
            StatusCode::BAD_REQUEST,
            format!("the upload broke off: {e}"),
        )
    };
    // Every frame is counted against the slot's size as it arrives.
    let mut counted = |c: Bytes| {
        got += c.len() as u64;
        if got > size {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("this slot is for {size} bytes"),
            ));
        }
        Ok(c)
    };
    let mut ended = false;
    while !ended {
        // Wait for the next bytes without holding a buffer.
        let first = match carried.take() {
            Some(c) => c,
            None => match tokio::time::timeout(slot_timeout, stream.next()).await {
                Err(_) => {
                    return Err((StatusCode::REQUEST_TIMEOUT, "the upload stalled".to_owned()))
                }
                Ok(None) => {
                    ended = true;
                    Bytes::new()
                }
                Ok(Some(Err(e))) => return Err(broke(e)),
                Ok(Some(Ok(c))) => counted(c)?,
            },
        };
        if ended {
            break;
        }
        let mut lent = BUFFERS.lend().await;
        let mut next = Some(first);
        // Fill the buffer while the body keeps coming: a client that
        // pauses for more than [`UPLOAD_FILL_GAP`] gets what it sent
        // written and the buffer goes back.
        while let Some(chunk) = next.take() {
            let room = UPLOAD_BUFFER - lent.buf.len();
            if chunk.len() > room {
                lent.buf.extend_from_slice(&chunk[..room]);
                carried = Some(chunk.slice(room..));
                break;
            }
            lent.buf.extend_from_slice(&chunk);
            if lent.buf.len() == UPLOAD_BUFFER {
                break;
            }
            match tokio::time::timeout(UPLOAD_FILL_GAP, stream.next()).await {
                Err(_) => {}
                Ok(None) => ended = true,
                Ok(Some(Err(e))) => return Err(broke(e)),
                Ok(Some(Ok(c))) => next = Some(counted(c)?),
            }
        }
        let written = tokio::task::spawn_blocking(move || {
            let r = file.write_all(&lent.buf);
            (file, lent, r)
        })
        .await;
        // A panic in the write, or the runtime shutting down.
        let (f, lent, r) = written.map_err(|e| failed(io::Error::other(e)))?;
        BUFFERS.give_back(lent);
        r.map_err(failed)?;
        file = f;
    }
    if got != size {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("{got} bytes received; this slot is for {size}"),
        ));
    }
    // An acknowledged upload must survive a crash (§7's 201 promises the
    // file): synced before the answer, without holding a buffer.
    let _sync = SYNCS.acquire().await.expect("never closed");
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(|e| failed(io::Error::other(e)))?
        .map_err(failed)
}

/// Whether browsers may show this type in place: images (not SVG, which
/// can carry scripts), audio and video.
pub(super) fn inline_type(essence: &str) -> bool {
    (essence.starts_with("image/") && essence != "image/svg+xml")
        || essence.starts_with("audio/")
        || essence.starts_with("video/")
}

/// `GET`/`HEAD /upload/{slot}/{name}`: the file, streamed; one byte range
/// of it when a `GET` asks (RFC 9110 §14: a client resumes a download cut
/// off), and `304 Not Modified` to a client whose copy is current (§13).
pub(super) async fn download(
    State(inner): State<Arc<Inner>>,
    UrlPath((slot, name)): UrlPath<(String, String)>,
    method: Method,
    request: HeaderMap,
) -> Response {
    let r = serve(&inner, &slot, &name, method, &request).await;
    UploadMetrics::count(&inner.metrics.downloads, "status", r.status().as_str());
    r
}

/// The work of [`download`].
pub(super) async fn serve(
    inner: &Inner,
    slot: &str,
    name: &str,
    method: Method,
    request: &HeaderMap,
) -> Response {
    let Some((dir, meta)) = lookup(inner, slot, name).await else {
        return not_found();
    };
    let Some(uploaded) = meta.uploaded else {
        return not_found();
    };
    let now = unix_now();
    let expires = file_expires(uploaded, meta.expire_before, inner.expire_after);
    if expires.is_some_and(|e| now >= e) {
        return not_found();
    }
    let file = match tokio::fs::File::open(dir.join(DATA_FILE)).await {
        Ok(f) => f,
        Err(_) => return not_found(),
    };
    let length = match file.metadata().await {
        Ok(m) => m.len(),
        Err(_) => return not_found(),
    };
    let media = meta.content_type.as_deref().and_then(MediaType::parse);
    let (essence, content_type) = match &media {
        Some(m) => (m.essence.as_str(), m.full.as_str()),
        None => ("application/octet-stream", "application/octet-stream"),
    };
    let disposition = format!(
        "{}; filename*=UTF-8''{}",
        if inline_type(essence) {
            "inline"
        } else {
            "attachment"
        },
        percent_encode(&meta.filename)
    );
    let max_age = expires.map_or(31_536_000, |e| e - now);
    let value = |s: &str| {
        HeaderValue::from_str(s)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
    };
    let validators = Validators::new(uploaded, length);
    let cache_control = value(&format!("private, max-age={max_age}, immutable"));
    if validators.not_modified(request) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        validators.insert(r.headers_mut());
        r.headers_mut().insert(header::CACHE_CONTROL, cache_control);
        return cors(r);
    }
    // §14.2: Range is defined for GET only.
    let range = request
        .get(header::RANGE)
        .filter(|_| method == Method::GET)
        .and_then(|v| v.to_str().ok())
        .filter(|_| validators.if_range_holds(request));
    let (code, first, count) = match wanted(range, length) {
        Wanted::Whole => (StatusCode::OK, 0, length),
        Wanted::Part(first, last) => (StatusCode::PARTIAL_CONTENT, first, last - first + 1),
        Wanted::Unsatisfiable => {
            let mut r = status(StatusCode::RANGE_NOT_SATISFIABLE, "no such byte range");
            r.headers_mut()
                .insert(header::CONTENT_RANGE, value(&format!("bytes */{length}")));
            return r;
        }
    };
    // Read on the blocking pool straight into the chunk hyper will write
    // (`tokio::fs::File` would read into a buffer of its own and copy).
    let mut file = file.into_std().await;
    if first > 0 {
        // Only moves the file offset: no I/O to wait for.
        if io::Seek::seek(&mut file, io::SeekFrom::Start(first)).is_err() {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the file");
        }
    }
    let sent = inner.metrics.sent_bytes.clone();
    let stream = futures_util::stream::try_unfold((file, count), move |(f, left)| {
        let sent = sent.clone();
        async move {
            if left == 0 {
                return Ok::<_, io::Error>(None);
            }
            let read = tokio::task::spawn_blocking(move || {
                let want = left.min(IO_CHUNK as u64);
                let mut chunk = Vec::with_capacity(want as usize);
                let r = io::Read::read_to_end(&mut io::Read::take(&f, want), &mut chunk);
                (f, chunk, r)
            })
            .await;
            let (f, chunk, r) = read.map_err(io::Error::other)?;
            r?;
            if chunk.is_empty() {
                Ok(None)
            } else {
                let left = left - chunk.len() as u64;
                sent.inc_by(chunk.len() as u64);
                Ok(Some((Bytes::from(chunk), (f, left))))
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, value(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    if code == StatusCode::PARTIAL_CONTENT {
        h.insert(
            header::CONTENT_RANGE,
            value(&format!("bytes {first}-{}/{length}", first + count - 1)),
        );
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    validators.insert(h);
    h.insert(header::CONTENT_DISPOSITION, value(&disposition));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // §9: nothing in an uploaded file runs, and no page frames it.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; media-src 'self'; frame-ancestors 'none'"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, cache_control);
    cors(r)
}

/// A stored file's validators (RFC 9110 §8.8). A slot's file never changes
/// once uploaded, so its upload time and length identify its content.
pub(crate) struct Validators {
    /// Strong entity tag: `"<uploaded>-<length>"` in hex.
    pub(super) etag: String,
    pub(super) last_modified: std::time::SystemTime,
}

impl Validators {
    pub(crate) fn new(uploaded: u64, length: u64) -> Validators {
        Validators {
            etag: format!("\"{uploaded:x}-{length:x}\""),
            // `uploaded` comes from `meta.json`: a value past what the
            // clock can hold must not panic the download.
            last_modified: std::time::UNIX_EPOCH
                .checked_add(Duration::from_secs(uploaded))
                .unwrap_or(std::time::UNIX_EPOCH),
        }
    }

    pub(super) fn insert(&self, h: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.etag) {
            h.insert(header::ETAG, v);
        }
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(self.last_modified)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }

    /// §13.2.2 steps 3–4: `If-None-Match` (weak comparison) when present,
    /// else `If-Modified-Since`.
    pub(crate) fn not_modified(&self, request: &HeaderMap) -> bool {
        let text = |name| {
            request
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
        };
        if let Some(tags) = text(header::IF_NONE_MATCH) {
            return tags
                .split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == self.etag);
        }
        text(header::IF_MODIFIED_SINCE)
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .is_some_and(|since| self.last_modified <= since)
    }

    /// §13.1.5: a `Range` applies only if `If-Range`, when present, names
    /// this content: the same strong entity tag, or exactly its
    /// modification date.
    pub(crate) fn if_range_holds(&self, request: &HeaderMap) -> bool {
        let Some(v) = request.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) else {
            return true;
        };
        let v = v.trim();
        if v.starts_with('"') {
            v == self.etag
        } else {
            httpdate::parse_http_date(v).is_ok_and(|d| d == self.last_modified)
        }
    }
}

/// What a `Range` header asks of a file of `length` bytes (RFC 9110 §14.1).
#[derive(Debug, PartialEq)]
pub(crate) enum Wanted {
    /// No range, or one to ignore (§14.2: another unit, bad syntax, or
    /// several ranges, which this server does not serve as multipart).
    Whole,
    /// Bytes `first..=last`.
    Part(u64, u64),
    /// A range starting past the end, or an empty suffix: 416.
    Unsatisfiable,
}

pub(crate) fn wanted(range: Option<&str>, length: u64) -> Wanted {
    let Some((unit, set)) = range.and_then(|r| r.split_once('=')) else {
        return Wanted::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") || set.contains(',') {
        return Wanted::Whole;
    }
    let Some((a, b)) = set.trim().split_once('-') else {
        return Wanted::Whole;
    };
    // Digits only; a position too large for u64 is past any file's end.
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().unwrap_or(u64::MAX))
    };
    match (number(a), number(b)) {
        (None, Some(suffix)) if a.is_empty() => {
            if suffix == 0 || length == 0 {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(length - suffix.min(length), length - 1)
            }
        }
        (Some(first), None) if b.is_empty() => {
            if first >= length {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(first, length - 1)
            }
        }
        (Some(first), Some(last)) if first <= last => {
            if first >= length {
                Wanted::Unsatisfiable
            } else {
                Wanted::Part(first, last.min(length - 1))
            }
        }
        _ => Wanted::Whole,
    }
}
