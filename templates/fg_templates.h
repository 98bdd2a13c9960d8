/* fg_templates.h: the table of templates embedded at build time (cmake/embed_templates.cmake). */
#ifndef FG_TEMPLATES_H
#define FG_TEMPLATES_H
#include <stddef.h>
typedef struct fg_embedded_template {
  const char *name;
  const char *text;
  size_t length;
} fg_embedded_template;
/* Terminated by an entry whose name is NULL. */
extern const fg_embedded_template fg_embedded_templates[];
#endif
