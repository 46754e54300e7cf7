/*
 * file.c - read-only file mappings and small whole-file reads.
 *
 * Weights are mapped MAP_PRIVATE | PROT_READ and used in place: tensor descriptors point into
 * the mapping, so opening a checkpoint costs page-table entries, not copies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"

int dsv4_file_map(struct dsv4_mapped_file *f, const char *path, struct dsv4_err *err)
{
    f->data = NULL;
    f->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dsv4_err_set(err, DSV4_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dsv4_err_set(err, DSV4_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dsv4_err_set(err, DSV4_EIO, "%s is not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dsv4_err_set(err, DSV4_EIO, "cannot map %s: %s", path, strerror(e));
        }
        f->data = p;
        f->size = (size_t)st.st_size;
    }
    close(fd);
    return DSV4_OK;
}

void dsv4_file_unmap(struct dsv4_mapped_file *f)
{
    if (f->data) munmap((void *)f->data, f->size);
    f->data = NULL;
    f->size = 0;
}

int dsv4_read_file(const char *path, char **out, size_t *len, size_t max_len, struct dsv4_err *err)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dsv4_err_set(err, DSV4_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char  *buf = malloc(cap + 1);
    if (!buf) {
        fclose(fp);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        size_t r = fread(buf + n, 1, cap - n, fp);
        n += r;
        if (r == 0) break;
        if (n > max_len) {
            free(buf);
            fclose(fp);
            return dsv4_err_set(err, DSV4_EFORMAT, "%s is larger than the %zu bytes allowed", path,
                                max_len);
        }
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                fclose(fp);
                return dsv4_err_set(err, DSV4_ENOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return dsv4_err_set(err, DSV4_EIO, "read error on %s", path);
    }
    buf[n] = '\0';
    *out   = buf;
    if (len) *len = n;
    return DSV4_OK;
}

bool dsv4_path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

char *dsv4_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char  *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}
